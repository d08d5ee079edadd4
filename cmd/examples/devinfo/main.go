// Command devinfo lists RDMA devices, much as ibv_devinfo does, for every
// provider go-rdma has: real devices through libibverbs and the pure-Go
// soft device.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/go-rdma/rdma"
)

func main() {
	dev := flag.String("d", "", "show only this device")
	flag.Parse()
	devs, err := rdma.Devices()
	if err != nil {
		fmt.Fprintln(os.Stderr, "devinfo:", err)
		os.Exit(1)
	}
	shown := 0
	for _, d := range devs {
		if *dev != "" && d.Name != *dev {
			continue
		}
		print(os.Stdout, d)
		shown++
	}
	if shown == 0 {
		if *dev != "" {
			fmt.Fprintf(os.Stderr, "devinfo: no device %q\n", *dev)
			os.Exit(1)
		}
		fmt.Println("No RDMA devices found")
	}
}

func print(w io.Writer, d rdma.Device) {
	fmt.Fprintf(w, "hca_id:\t%s\n", d.Name)
	fmt.Fprintf(w, "\tprovider:\t\t%s\n", d.Provider)
	fmt.Fprintf(w, "\ttransport:\t\t%s\n", d.Transport)
	if d.NodeType != "" {
		fmt.Fprintf(w, "\tnode_type:\t\t%s\n", d.NodeType)
	}
	if d.FWVer != "" {
		fmt.Fprintf(w, "\tfw_ver:\t\t\t%s\n", d.FWVer)
	}
	fmt.Fprintf(w, "\tnode_guid:\t\t%s\n", d.NodeGUID)
	if d.Usable {
		fmt.Fprintf(w, "\tusable:\t\t\tyes\n")
	} else {
		fmt.Fprintf(w, "\tusable:\t\t\tno (%s)\n", d.Why)
	}
	for _, p := range d.Ports {
		fmt.Fprintf(w, "\t\tport:\t%d\n", p.Port)
		fmt.Fprintf(w, "\t\t\tstate:\t\t\tPORT_%s (%d)\n", p.State, p.State)
		if p.MaxMTU != 0 {
			fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%s (%d)\n", p.MaxMTU, p.MaxMTU)
		}
		if p.ActiveMTU != 0 {
			fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%s (%d)\n", p.ActiveMTU, p.ActiveMTU)
		}
		fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
		if p.PhysState != "" {
			fmt.Fprintf(w, "\t\t\tphys_state:\t\t%s\n", p.PhysState)
		}
		fmt.Fprintf(w, "\t\t\tport_lid:\t\t%d\n", p.LID)
		for _, g := range p.GIDs {
			fmt.Fprintf(w, "\t\t\tGID[%3d]:\t\t%s", g.Index, g.GID)
			if g.Type != "" {
				fmt.Fprintf(w, ", %s", g.Type)
			}
			if g.Netdev != "" {
				fmt.Fprintf(w, " (%s)", g.Netdev)
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w)
}
