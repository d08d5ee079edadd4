package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/go-rdma/rdma"
)

// connKey names a connection across samples: its two addresses.
type connKey struct{ local, remote string }

// show prints one refresh: with prev, the rates since prev; without, the
// counters so far.
func show(w io.Writer, prev *sample, cur sample) {
	engines := slices.Clone(cur.engines)
	// Engines of one device port (two OpenEngine calls) come in no
	// order: their first connection keeps them in place between refreshes.
	first := func(e rdma.EngineStats) string {
		if len(e.Connections) == 0 {
			return ""
		}
		return slices.MinFunc(e.Connections, func(a, b rdma.ConnEntry) int { return cmp.Compare(a.Local, b.Local) }).Local
	}
	slices.SortStableFunc(engines, func(a, b rdma.EngineStats) int {
		return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Port, b.Port), cmp.Compare(first(a), first(b)))
	})
	before := map[connKey]rdma.ConnStats{}
	secs := 0.0
	if prev != nil {
		secs = cur.at.Sub(prev.at).Seconds()
		for _, e := range prev.engines {
			for _, c := range e.Connections {
				before[connKey{c.Local, c.Remote}] = c.Stats
			}
		}
	}
	if prev != nil {
		fmt.Fprintf(w, "%s  rates over %.2fs\n", cur.at.Format("15:04:05.000"), secs)
	} else {
		fmt.Fprintf(w, "%s  counters so far\n", cur.at.Format("15:04:05.000"))
	}
	for _, e := range engines {
		showEngine(w, e, before, prev != nil, secs)
	}
}

func showEngine(w io.Writer, e rdma.EngineStats, before map[connKey]rdma.ConnStats, rates bool, secs float64) {
	var posted, depth int64
	for _, q := range e.SharedReceives {
		posted += q.Posted
		depth += int64(q.Depth)
	}
	fmt.Fprintf(w, "engine %s %s port %d: connections %d, SRQ posted %d/%d, pool in use %s of %s registered\n",
		e.Provider, e.Device, e.Port, e.Conns, posted, depth, size(float64(e.Pool.BytesInUse)), size(float64(e.Pool.BytesRegistered)))
	if len(e.Connections) == 0 {
		return
	}
	conns := slices.Clone(e.Connections)
	slices.SortFunc(conns, func(a, b rdma.ConnEntry) int {
		return cmp.Or(cmp.Compare(a.Local, b.Local), cmp.Compare(a.Remote, b.Remote))
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	per := "/s"
	if !rates {
		per = ""
	}
	// AlignRight puts the numbers flush right; the addresses are padded
	// the same way, which reads well enough for host:port.
	fmt.Fprintf(tw, "LOCAL\tREMOTE\tSEND%s\tSEND-B%s\tRECV%s\tRECV-B%s\tRW-B%s\tCOMPL%s\tFAILED\tCWAIT\t\n", per, per, per, per, per, per)
	for _, c := range conns {
		d := delta(before[connKey{c.Local, c.Remote}], c.Stats)
		// Without a previous sample the counters are shown as they are.
		rate := func(v uint64) float64 { return float64(v) }
		if rates && secs > 0 {
			rate = func(v uint64) float64 { return float64(v) / secs }
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t\n", c.Local, c.Remote,
			msgs(rate(d.Sends)), size(rate(d.SendBytes)), msgs(rate(d.Recvs)), size(rate(d.RecvBytes)),
			size(rate(d.WriteBytes+d.ReadBytes)), msgs(rate(d.Completions)), d.Failed, d.CreditWaits)
	}
	tw.Flush()
}

// delta is what the counters of a connection grew by since before. A
// connection new since the last sample has its counters as they are.
func delta(before, now rdma.ConnStats) rdma.ConnStats {
	sub := func(a, b uint64) uint64 {
		if a < b {
			return a // not the same connection: its addresses were reused
		}
		return a - b
	}
	return rdma.ConnStats{
		Sends: sub(now.Sends, before.Sends), SendBytes: sub(now.SendBytes, before.SendBytes),
		WriteBytes: sub(now.WriteBytes, before.WriteBytes), ReadBytes: sub(now.ReadBytes, before.ReadBytes),
		Recvs: sub(now.Recvs, before.Recvs), RecvBytes: sub(now.RecvBytes, before.RecvBytes),
		Completions: sub(now.Completions, before.Completions), Failed: sub(now.Failed, before.Failed),
		CreditWaits: sub(now.CreditWaits, before.CreditWaits),
	}
}

// msgs formats a number of messages: whole, with k and M past 10,000.
func msgs(v float64) string {
	switch {
	case v >= 10e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case v >= 10e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// size formats a number of bytes in binary units.
func size(v float64) string {
	const unit = 1024
	if v < unit {
		return strconv.FormatFloat(v, 'f', 0, 64) + "B"
	}
	suffix := "KMGTP"
	i := 0
	for v /= unit; v >= unit && i < len(suffix)-1; v /= unit {
		i++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + suffix[i:i+1] + "iB"
}
