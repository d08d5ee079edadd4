// Package sysfs lists RDMA devices from /sys/class/infiniband without
// opening them. Listing is read-only and needs no cgo; a listed device
// is not proof that QPs, MRs or routes work.
package sysfs

import (
	"bytes"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Root is the sysfs class directory; tests point it at a fake tree.
var Root = "/sys/class/infiniband"

// Devices lists every device under Root. A missing Root means no devices,
// not an error.
func Devices() ([]verbs.DeviceInfo, error) {
	ents, err := os.ReadDir(Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []verbs.DeviceInfo
	for _, e := range ents {
		d, err := Device(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Device reads one device. An unknown name wraps verbs.ErrNoDevice.
func Device(name string) (verbs.DeviceInfo, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return verbs.DeviceInfo{}, &os.PathError{Op: "open", Path: name, Err: verbs.ErrNoDevice}
	}
	dir := filepath.Join(Root, name)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return verbs.DeviceInfo{}, &os.PathError{Op: "open", Path: name, Err: verbs.ErrNoDevice}
		}
		return verbs.DeviceInfo{}, err
	}
	d := verbs.DeviceInfo{
		Name:     name,
		Provider: "verbs",
		NodeGUID: parseGUID(read(dir, "node_guid")),
		FWVer:    read(dir, "fw_ver"),
	}
	nodeType := read(dir, "node_type") // "1: CA", "4: RNIC"
	if _, t, ok := strings.Cut(nodeType, ": "); ok {
		d.NodeType = t
	} else {
		d.NodeType = nodeType
	}
	d.Transport = "InfiniBand"
	if d.NodeType == "RNIC" {
		d.Transport = "iWARP"
	}
	ports, _ := os.ReadDir(filepath.Join(dir, "ports"))
	for _, p := range ports {
		n, err := strconv.Atoi(p.Name())
		if err != nil || n < 1 || n > 255 {
			continue
		}
		d.Ports = append(d.Ports, readPort(filepath.Join(dir, "ports", p.Name()), uint8(n)))
	}
	slices.SortFunc(d.Ports, func(a, b verbs.PortInfo) int { return int(a.Port) - int(b.Port) })
	return d, nil
}

func readPort(dir string, n uint8) verbs.PortInfo {
	p := verbs.PortInfo{
		Port:      n,
		PhysState: read(dir, "phys_state"),
		LinkLayer: read(dir, "link_layer"),
		Rate:      read(dir, "rate"),
	}
	if s, _, ok := strings.Cut(read(dir, "state"), ":"); ok {
		v, _ := strconv.Atoi(s)
		p.State = verbs.PortState(v)
	}
	if lid, err := strconv.ParseUint(strings.TrimPrefix(read(dir, "lid"), "0x"), 16, 16); err == nil {
		p.LID = uint16(lid)
	}
	gids, _ := os.ReadDir(filepath.Join(dir, "gids"))
	for _, g := range gids {
		i, err := strconv.Atoi(g.Name())
		if err != nil {
			continue
		}
		gid, ok := parseGID(read(dir, "gids", g.Name()))
		if !ok || gid.IsZero() {
			continue
		}
		p.GIDs = append(p.GIDs, verbs.GIDEntry{
			Index:  i,
			GID:    gid,
			Type:   verbs.GIDType(read(dir, "gid_attrs", "types", g.Name())),
			Netdev: read(dir, "gid_attrs", "ndevs", g.Name()),
		})
	}
	slices.SortFunc(p.GIDs, func(a, b verbs.GIDEntry) int { return a.Index - b.Index })
	if p.LinkLayer == "Ethernet" {
		// sysfs has no MTU for RoCE ports; the netdev MTU bounds it.
		for _, g := range p.GIDs {
			if g.Netdev == "" {
				continue
			}
			if mtu, err := strconv.Atoi(readFile(filepath.Join(filepath.Dir(Root), "net", g.Netdev, "mtu"))); err == nil {
				p.ActiveMTU = verbs.MTUFromBytes(mtu)
				break
			}
		}
	}
	return p
}

// Openable reports whether the device looks usable without opening it:
// the kernel exposes its uverbs character device and a port is ACTIVE.
// Opening it (libibverbs) is the real test; this one is cheap.
func Openable(d verbs.DeviceInfo) bool {
	// /sys/class/infiniband_verbs/uverbsN/ibdev names the device that
	// /dev/infiniband/uverbsN opens.
	verbsDir := filepath.Join(filepath.Dir(Root), "infiniband_verbs")
	ents, _ := os.ReadDir(verbsDir)
	found := false
	for _, e := range ents {
		if read(verbsDir, e.Name(), "ibdev") == d.Name {
			_, err := os.Stat(filepath.Join("/dev/infiniband", e.Name()))
			found = err == nil
			break
		}
	}
	if !found {
		return false
	}
	for _, p := range d.Ports {
		if p.State == verbs.PortActive {
			return true
		}
	}
	return false
}

// read returns the trimmed contents of a sysfs attribute, or "" when it
// is missing or unreadable (unused GID entries fail to read by design).
func read(dir string, elem ...string) string {
	return readFile(filepath.Join(append([]string{dir}, elem...)...))
}

// readFileWhole is readFile through os.ReadFile, for any length.
func readFileWhole(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return trim(b)
}

// trim is the attribute's text without its surrounding space, in a
// string of its own.
func trim(b []byte) string {
	return string(bytes.TrimSpace(b))
}

// parseGUID parses "0011:2233:4455:6677".
func parseGUID(s string) verbs.GUID {
	v, err := strconv.ParseUint(strings.ReplaceAll(s, ":", ""), 16, 64)
	if err != nil {
		return 0
	}
	return verbs.GUID(v)
}

// parseGID parses sysfs' "fe80:0000:0000:0000:0000:0000:0000:0001" form.
func parseGID(s string) (verbs.GID, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return verbs.GID{}, false
	}
	return verbs.GID(a.As16()), true
}
