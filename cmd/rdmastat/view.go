package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/go-rdma/rdma"
)

// connKey names a connection across samples: its two addresses.
type connKey struct{ local, remote string }

// engineKey names an engine across samples: its provider, device and
// port. Engines that share them (two OpenEngine calls on one port) are
// shown as one, as promrdma exports them: without per-connection
// counters nothing else tells them apart from one sample to the next.
type engineKey struct {
	provider, device string
	port             uint8
}

func keyOf(e rdma.EngineStats) engineKey { return engineKey{e.Provider, e.Device, e.Port} }

// merge sums the engines that share their key, in the order of their
// first.
func merge(engines []rdma.EngineStats) []rdma.EngineStats {
	var out []rdma.EngineStats
	at := map[engineKey]int{}
	for _, e := range engines {
		i, ok := at[keyOf(e)]
		if !ok {
			at[keyOf(e)] = len(out)
			out = append(out, e)
			continue
		}
		m := &out[i]
		m.Conns += e.Conns
		m.Total = sum(m.Total, e.Total)
		m.Closed = sum(m.Closed, e.Closed)
		m.Connections = append(slices.Clip(m.Connections), e.Connections...)
		m.SharedReceives = append(slices.Clip(m.SharedReceives), e.SharedReceives...)
		m.Pool.BytesInUse += e.Pool.BytesInUse
		m.Pool.BytesRegistered += e.Pool.BytesRegistered
	}
	return out
}

// show prints one refresh: with prev, the rates since prev; without, the
// counters so far. Each engine shows its top connections by operations
// per second (all of them for top 0).
func show(w io.Writer, prev *sample, cur sample, top int) {
	engines := merge(cur.engines)
	slices.SortFunc(engines, func(a, b rdma.EngineStats) int {
		return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Port, b.Port))
	})
	v := view{top: top, hint: cur.connsHint, conns: map[connKey]rdma.ConnStats{}, engines: map[engineKey]rdma.ConnStats{}}
	if prev != nil {
		v.rates = true
		v.secs = cur.at.Sub(prev.at).Seconds()
		for _, e := range merge(prev.engines) {
			v.engines[keyOf(e)] = sum(e.Total, e.Closed)
			for _, c := range e.Connections {
				v.conns[connKey{c.Local, c.Remote}] = c.Stats
			}
		}
	}
	if prev != nil {
		fmt.Fprintf(w, "%s  rates over %.2fs\n", cur.at.Format("15:04:05.000"), v.secs)
	} else {
		fmt.Fprintf(w, "%s  counters so far\n", cur.at.Format("15:04:05.000"))
	}
	for _, e := range engines {
		v.engine(w, e)
	}
}

// view is what a refresh compares with: the counters of the previous
// sample, by engine and by connection.
type view struct {
	rates   bool
	secs    float64
	top     int
	hint    string
	engines map[engineKey]rdma.ConnStats
	conns   map[connKey]rdma.ConnStats
}

// rate is v per second of the interval, or v itself without one.
func (v *view) rate(n uint64) float64 {
	if v.rates && v.secs > 0 {
		return float64(n) / v.secs
	}
	return float64(n)
}

// ops counts what a connection did: operations issued and messages
// received, the measure of a busy connection.
func ops(cs rdma.ConnStats) uint64 { return cs.Sends + cs.Writes + cs.Reads + cs.Atomics + cs.Recvs }

func (v *view) engine(w io.Writer, e rdma.EngineStats) {
	var posted, depth int64
	for _, q := range e.SharedReceives {
		posted += q.Posted
		depth += int64(q.Depth)
	}
	fmt.Fprintf(w, "engine %s %s port %d: connections %d, SRQ posted %d/%d, pool in use %s of %s registered\n",
		e.Provider, e.Device, e.Port, e.Conns, posted, depth, size(float64(e.Pool.BytesInUse)), size(float64(e.Pool.BytesRegistered)))
	// The engine's counters, closed connections included, so that
	// they only grow.
	d := delta(v.engines[keyOf(e)], sum(e.Total, e.Closed))
	per := "/s"
	if !v.rates {
		per = ""
	}
	lat := "latency: no samples"
	if n := d.Latency.Count(); n > 0 {
		lat = fmt.Sprintf("latency p50 %v p99 %v (%d sampled)", round(d.Latency.Quantile(0.5)), round(d.Latency.Quantile(0.99)), n)
	}
	fmt.Fprintf(w, "  ops%s %s, bytes%s %s, %s, failed %d, queue full %d\n", per, msgs(v.rate(ops(d))), per,
		size(v.rate(d.SendBytes+d.WriteBytes+d.ReadBytes+d.RecvBytes)), lat, d.Failed+d.RecvFailed, d.QueueFull)
	if len(e.Connections) == 0 {
		if e.Conns > 0 && v.hint != "" {
			fmt.Fprintf(w, "  no per-connection counters: the process would export them with %s\n", v.hint)
		}
		return
	}
	type row struct {
		c rdma.ConnEntry
		d rdma.ConnStats
	}
	rows := make([]row, 0, len(e.Connections))
	for _, c := range e.Connections {
		rows = append(rows, row{c, delta(v.conns[connKey{c.Local, c.Remote}], c.Stats)})
	}
	// The busiest first; the addresses keep ties in place between
	// refreshes.
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(ops(b.d), ops(a.d)), cmp.Compare(a.c.Local, b.c.Local), cmp.Compare(a.c.Remote, b.c.Remote))
	})
	if v.top > 0 && len(rows) > v.top {
		fmt.Fprintf(w, "  top %d of %d connections by ops%s\n", v.top, len(rows), per)
		rows = rows[:v.top]
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// AlignRight puts the numbers flush right; the addresses are padded
	// the same way, which reads well enough for host:port.
	fmt.Fprintf(tw, "LOCAL\tREMOTE\tSEND%s\tSEND-B%s\tRECV%s\tRECV-B%s\tRW-B%s\tCOMPL%s\tFAILED\tCWAIT\t\n", per, per, per, per, per, per)
	for _, r := range rows {
		d := r.d
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t\n", r.c.Local, r.c.Remote,
			msgs(v.rate(d.Sends)), size(v.rate(d.SendBytes)), msgs(v.rate(d.Recvs)), size(v.rate(d.RecvBytes)),
			size(v.rate(d.WriteBytes+d.ReadBytes)), msgs(v.rate(d.Completions)), d.Failed, d.CreditWaits)
	}
	tw.Flush()
}

// round shortens a latency to three significant digits or so.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond)
	}
	return d
}

// sum is a plus b, for the counters rdmastat shows.
func sum(a, b rdma.ConnStats) rdma.ConnStats {
	return rdma.ConnStats{
		Sends: a.Sends + b.Sends, SendBytes: a.SendBytes + b.SendBytes,
		Writes: a.Writes + b.Writes, WriteBytes: a.WriteBytes + b.WriteBytes,
		Reads: a.Reads + b.Reads, ReadBytes: a.ReadBytes + b.ReadBytes,
		Atomics: a.Atomics + b.Atomics,
		Recvs:   a.Recvs + b.Recvs, RecvBytes: a.RecvBytes + b.RecvBytes,
		Completions: a.Completions + b.Completions, Failed: a.Failed + b.Failed, RecvFailed: a.RecvFailed + b.RecvFailed,
		CreditWaits: a.CreditWaits + b.CreditWaits, QueueFull: a.QueueFull + b.QueueFull,
		Latency: addLatency(a.Latency, b.Latency),
	}
}

func addLatency(a, b rdma.LatencyHistogram) rdma.LatencyHistogram {
	for i := range a.Buckets {
		a.Buckets[i] += b.Buckets[i]
	}
	a.Sum += b.Sum
	return a
}

// delta is what the counters of a connection (or an engine) grew by
// since before. A connection new since the last sample has its counters
// as they are.
func delta(before, now rdma.ConnStats) rdma.ConnStats {
	sub := func(a, b uint64) uint64 {
		if a < b {
			return a // not the same connection: its addresses were reused
		}
		return a - b
	}
	d := rdma.ConnStats{
		Sends: sub(now.Sends, before.Sends), SendBytes: sub(now.SendBytes, before.SendBytes),
		Writes: sub(now.Writes, before.Writes), WriteBytes: sub(now.WriteBytes, before.WriteBytes),
		Reads: sub(now.Reads, before.Reads), ReadBytes: sub(now.ReadBytes, before.ReadBytes),
		Atomics: sub(now.Atomics, before.Atomics),
		Recvs:   sub(now.Recvs, before.Recvs), RecvBytes: sub(now.RecvBytes, before.RecvBytes),
		Completions: sub(now.Completions, before.Completions), Failed: sub(now.Failed, before.Failed),
		RecvFailed:  sub(now.RecvFailed, before.RecvFailed),
		CreditWaits: sub(now.CreditWaits, before.CreditWaits), QueueFull: sub(now.QueueFull, before.QueueFull),
	}
	for i := range d.Latency.Buckets {
		d.Latency.Buckets[i] = sub(now.Latency.Buckets[i], before.Latency.Buckets[i])
	}
	if now.Latency.Sum >= before.Latency.Sum {
		d.Latency.Sum = now.Latency.Sum - before.Latency.Sum
	}
	return d
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
