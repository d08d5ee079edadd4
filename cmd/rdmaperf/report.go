package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

const rule = "---------------------------------------------------------------------------------------"

var testTitles = map[string]string{
	"write_bw": "RDMA_Write BW Test", "send_bw": "Send BW Test", "read_bw": "RDMA_Read BW Test",
	"atomic_bw": "Atomic FETCH_AND_ADD BW Test", "write_lat": "RDMA_Write Latency Test",
	"send_lat": "Send Latency Test", "read_lat": "RDMA_Read Latency Test",
}

func header(w io.Writer, p *params, provider, device string) {
	fmt.Fprintln(w, rule)
	fmt.Fprintf(w, "                    %s (rdmaperf)\n", testTitles[p.test])
	fmt.Fprintf(w, " API            : %s\n Provider       : %s\n Device         : %s\n", p.api, provider, device)
	if p.isLat {
		fmt.Fprintf(w, " Polling        : busy\n")
	} else {
		fmt.Fprintf(w, " TX depth       : %d\n Post list      : %d\n CQ Moderation  : %d\n", p.txDepth, p.postList, p.cqMod)
	}
	if p.duration > 0 {
		fmt.Fprintf(w, " Duration       : %v per size\n", p.duration)
	}
	fmt.Fprintln(w, rule)
	if p.isLat {
		fmt.Fprintln(w, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
		return
	}
	unit := "MiB/sec"
	if p.gbits {
		unit = "Gb/sec"
	}
	fmt.Fprintf(w, " #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit)
}

func row(w io.Writer, p *params, r result) {
	if p.isLat {
		fmt.Fprintf(w, " %-7d %-7d          %-7.2f        %-7.2f      %-7.2f          %-7.2f        %-7.2f          %-7.2f                %-7.2f\n",
			r.Bytes, r.Iters, r.TMin, r.TMax, r.TTypical, r.TAvg, r.TStdev, r.T99, r.T999)
		return
	}
	peak, avg := r.BWPeakMiB, r.BWAvgMiB
	if p.gbits {
		peak, avg = r.BWPeakGbps, r.BWAvgGbps
	}
	fmt.Fprintf(w, " %-7d    %-7d          %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Bytes, r.Iters, peak, avg, r.MsgRate)
}

// bwMeter measures a bandwidth run: the average over the whole run and
// the peak over windows of at least a tenth of it and at least four tx
// depths (so that completions taken in one burst do not count as a rate).
type bwMeter struct {
	start     time.Time
	lastT     time.Time
	lastN     int
	window    int           // ops per window (-n mode)
	windowDur time.Duration // (-D mode)
	peak      float64       // ops per second
}

func newBWMeter(iters, txDepth int, dur time.Duration) *bwMeter {
	m := &bwMeter{window: max(iters/10, 4*txDepth), windowDur: dur / 10}
	return m
}

func (m *bwMeter) begin(now time.Time) { m.start, m.lastT, m.lastN = now, now, 0 }

// progress records that done operations have completed by now.
func (m *bwMeter) progress(now time.Time, done int) {
	if m.windowDur > 0 {
		if now.Sub(m.lastT) < m.windowDur {
			return
		}
	} else if done-m.lastN < m.window {
		return
	}
	if el := now.Sub(m.lastT).Seconds(); el > 0 {
		m.peak = max(m.peak, float64(done-m.lastN)/el)
	}
	m.lastT, m.lastN = now, done
}

func (m *bwMeter) result(p *params, size, done int, end time.Time) result {
	el := end.Sub(m.start).Seconds()
	rate := float64(done) / el
	peak := max(m.peak, rate)
	return result{
		Test: p.test, API: p.api, Bytes: size, Iters: done, Seconds: el,
		BWPeakGbps: peak * float64(size) * 8 / 1e9, BWAvgGbps: rate * float64(size) * 8 / 1e9,
		BWPeakMiB: peak * float64(size) / (1 << 20), BWAvgMiB: rate * float64(size) / (1 << 20),
		MsgRate: rate / 1e6,
	}
}

// latResult sums up latency samples (ns) as perftest does: typical is the
// median, percentiles by rank.
func latResult(p *params, size int, samples []float64) result {
	s := slices.Clone(samples)
	slices.Sort(s)
	n := len(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	avg := sum / float64(n)
	vr := 0.0
	for _, v := range s {
		vr += (v - avg) * (v - avg)
	}
	pct := func(q float64) float64 { return s[min(n-1, int(math.Ceil(q*float64(n)))-1)] / 1e3 }
	return result{
		Test: p.test, API: p.api, Bytes: size, Iters: n,
		TMin: s[0] / 1e3, TMax: s[n-1] / 1e3, TTypical: s[n/2] / 1e3, TAvg: avg / 1e3,
		TStdev: math.Sqrt(vr/float64(n)) / 1e3, T99: pct(0.99), T999: pct(0.999),
	}
}

// parseTable reads the rows of rdmaperf's (or perftest's) table: the
// lines after the column header that start with a number.
func parseTable(out string) [][]float64 {
	var rows [][]float64
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "#bytes" {
			in = true
			continue
		}
		if !in || len(f) == 0 {
			continue
		}
		var vals []float64
		for _, x := range f {
			var v float64
			if _, err := fmt.Sscan(x, &v); err != nil {
				vals = nil
				break
			}
			vals = append(vals, v)
		}
		if vals != nil {
			rows = append(rows, vals)
		}
	}
	return rows
}
