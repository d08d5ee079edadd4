package sysfs

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma/internal/verbs"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeTree builds a sysfs tree for a RoCE device whose RoCE v2 IPv4 GID is
// not at index 1, as it is on a default rxe setup.
func fakeTree(t *testing.T) string {
	root := filepath.Join(t.TempDir(), "class", "infiniband")
	dev := filepath.Join(root, "rxe9")
	write(t, filepath.Join(dev, "node_guid"), "5054:00ff:fe12:3456")
	write(t, filepath.Join(dev, "node_type"), "1: CA")
	write(t, filepath.Join(dev, "fw_ver"), "0.0.0")
	p := filepath.Join(dev, "ports", "1")
	write(t, filepath.Join(p, "state"), "4: ACTIVE")
	write(t, filepath.Join(p, "phys_state"), "5: LinkUp")
	write(t, filepath.Join(p, "link_layer"), "Ethernet")
	write(t, filepath.Join(p, "lid"), "0x0")
	gids := []struct{ gid, typ string }{
		{"fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1"},
		{"0000:0000:0000:0000:0000:ffff:0a63:0001", "IB/RoCE v1"},
		{"fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2"},
		{"0000:0000:0000:0000:0000:ffff:0a63:0001", "RoCE v2"},
		{"0000:0000:0000:0000:0000:0000:0000:0000", ""},
	}
	for i, g := range gids {
		n := string(rune('0' + i))
		write(t, filepath.Join(p, "gids", n), g.gid)
		if g.typ != "" {
			write(t, filepath.Join(p, "gid_attrs", "types", n), g.typ)
			write(t, filepath.Join(p, "gid_attrs", "ndevs", n), "veth9")
		}
	}
	write(t, filepath.Join(root, "..", "net", "veth9", "mtu"), "1500")
	return root
}

// Rule: the RoCE v2 GID is chosen by its type and address family from
// sysfs, never by a fixed index.
func TestSelectGIDByType(t *testing.T) {
	old := Root
	Root = fakeTree(t)
	t.Cleanup(func() { Root = old })

	devs, err := Devices()
	if err != nil || len(devs) != 1 {
		t.Fatalf("Devices = %v, %v; want one device", devs, err)
	}
	d := devs[0]
	if d.Name != "rxe9" || d.NodeGUID.String() != "5054:00ff:fe12:3456" || d.NodeType != "CA" || d.Transport != "InfiniBand" {
		t.Errorf("device = %+v", d)
	}
	if len(d.Ports) != 1 || d.Ports[0].State != verbs.PortActive || d.Ports[0].LinkLayer != "Ethernet" {
		t.Fatalf("ports = %+v", d.Ports)
	}
	if got := len(d.Ports[0].GIDs); got != 4 {
		t.Errorf("%d GIDs listed, want 4 (the zero entry is unused)", got)
	}
	if d.Ports[0].ActiveMTU != verbs.MTU1024 {
		t.Errorf("active MTU from a 1500-byte netdev = %v, want 1024", d.Ports[0].ActiveMTU)
	}
	g, err := verbs.SelectGID(d.Ports[0], true)
	if err != nil || g.Index != 3 || g.GID.String() != "10.99.0.1" {
		t.Errorf("SelectGID(v4) = %+v, %v; want index 3, 10.99.0.1", g, err)
	}
	g, err = verbs.SelectGID(d.Ports[0], false)
	if err != nil || g.Index != 2 {
		t.Errorf("SelectGID(v6) = %+v, %v; want index 2", g, err)
	}
}

// Rule: no devices is an empty list, not an error; a bad name is
// ErrNoDevice.
func TestNoDevices(t *testing.T) {
	old := Root
	Root = filepath.Join(t.TempDir(), "missing")
	t.Cleanup(func() { Root = old })
	devs, err := Devices()
	if err != nil || len(devs) != 0 {
		t.Errorf("Devices on a machine without RDMA = %v, %v", devs, err)
	}
	for _, name := range []string{"nosuch0", "", "../net", "a/b"} {
		if _, err := Device(name); !errors.Is(err, verbs.ErrNoDevice) {
			t.Errorf("Device(%q) = %v, want ErrNoDevice", name, err)
		}
	}
}

// readFile gives an attribute's trimmed text whatever its length, "" for
// one that cannot be read, and reading one allocates only its string:
// listing a RoCE device reads a file per GID entry, over a thousand.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	write(t, short, "  4: ACTIVE ")
	long := filepath.Join(dir, "long")
	text := strings.Repeat("0123456789abcdef", 40) // longer than one read's buffer
	write(t, long, text)
	assert.Equal(t, "4: ACTIVE", readFile(short))
	assert.Equal(t, text, readFile(long))
	assert.Equal(t, "", readFile(filepath.Join(dir, "missing")))
	assert.Equal(t, "", readFile(dir), "a directory")
	if runtime.GOOS == "linux" && !raceOn {
		allocs := testing.AllocsPerRun(100, func() { readFile(short) })
		assert.LessOrEqual(t, allocs, 2.0, "allocations per read")
	}
}
