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

// header prints the test's parameters; qps is the number of QPs (or
// connections) actually set up.
func header(w io.Writer, p *params, provider, device string, qps int) {
	fmt.Fprintln(w, rule)
	fmt.Fprintf(w, "                    %s (rdmaperf)\n", testTitles[p.test])
	fmt.Fprintf(w, " API            : %s\n Provider       : %s\n Device         : %s\n", p.api, provider, device)
	poll := p.pollMode
	if p.api == "verbs" {
		poll = "busy"
		if p.events {
			poll = "events (completion channel)"
		}
	}
	fmt.Fprintf(w, " Polling        : %s\n", poll)
	if p.ud {
		fmt.Fprintf(w, " Connection type: UD\n Mtu            : %d[B]\n", p.udMTU)
	}
	if !p.isLat {
		fmt.Fprintf(w, " Number of qps  : %d\n", qps)
		if p.api != "stream" {
			fmt.Fprintf(w, " TX depth       : %d\n Post list      : %d\n CQ Moderation  : %d\n", p.txDepth, p.postList, p.cqMod)
		}
	}
	if p.api == "verbs" && (p.test == "send_bw" || p.test == "write_bw" || p.test == "send_lat" || p.test == "write_lat") {
		fmt.Fprintf(w, " Max inline data: %d[B]\n", p.inline)
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
// With -q the run is -q times -n operations and -q tx depths in flight.
type bwMeter struct {
	start     time.Time
	lastT     time.Time
	lastN     int
	window    int           // ops per window (-n mode)
	windowDur time.Duration // (-D mode)
	peak      float64       // ops per second
	line      *progressLine
}

func newBWMeter(p *params, size int) *bwMeter {
	q := max(p.qps, 1)
	return &bwMeter{window: max(p.iters*q/10, 4*p.txDepth*q), windowDur: p.duration / 10, line: newProgressLine(p, size)}
}

func (m *bwMeter) begin(now time.Time) {
	m.start, m.lastT, m.lastN = now, now, 0
	m.line.begin(now)
}

// progress records that done operations have completed by now.
func (m *bwMeter) progress(now time.Time, done int) {
	if m.line != nil && !now.Before(m.line.next) {
		m.line.show(now, done, 0)
	}
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
	m.line.end()
	el := end.Sub(m.start).Seconds()
	rate := 0.0 // no time measured (a UD receiver's datagrams that came in one instant): no rate, not +Inf
	if el > 0 {
		rate = float64(done) / el
	}
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

// progressLine shows how a long run goes, on stderr once per second:
// from the start with -D, else once a size has run for 2 s. On a
// terminal each line overwrites the last (\r) and the last is erased when
// the size ends; elsewhere they are plain lines.
type progressLine struct {
	w     io.Writer
	tty   bool
	test  string
	unit  string // bandwidth unit; "" for latency tests
	size  int
	every time.Duration
	first time.Duration // from begin to the first line
	start time.Time
	next  time.Time // the next line is due
	// latency tests read the TSC, not the clock, per iteration
	// (calibrated by then: bandwidth tests never calibrate it, which
	// takes 50 ms)
	nextC  uint64
	sum    float64 // latency samples summed so far (ns)
	summed int
	shown  bool
}

// newProgressLine is nil when there is to be no progress line.
func newProgressLine(p *params, size int) *progressLine {
	if !p.progress || p.stderr == nil {
		return nil
	}
	l := &progressLine{w: p.stderr, tty: p.tty, test: p.test, size: size, every: p.progressEvery, first: p.progressAfter}
	if p.duration > 0 {
		l.first = p.progressEvery
	}
	if !p.isLat {
		l.unit = "MiB/s"
		if p.gbits {
			l.unit = "Gb/s"
		}
	}
	l.begin(time.Now())
	return l
}

func (l *progressLine) begin(now time.Time) {
	if l == nil {
		return
	}
	l.start, l.next = now, now.Add(l.first)
	l.sum, l.summed = 0, 0
	if l.unit == "" {
		l.nextC = cycles() + uint64(float64(l.first)/cycleNS())
	}
}

// tick is the latency loops' check, one TSC read per iteration; samples
// are the latencies so far (ns).
func (l *progressLine) tick(samples []float64) {
	if l == nil || cycles() < l.nextC {
		return
	}
	for _, v := range samples[l.summed:] {
		l.sum += v
	}
	l.summed = len(samples)
	l.show(time.Now(), len(samples), l.sum)
}

// show prints the line for iters operations done by now (sum: the
// latency samples' total, latency tests only).
func (l *progressLine) show(now time.Time, iters int, sum float64) {
	l.next = now.Add(l.every)
	if l.unit == "" {
		l.nextC = cycles() + uint64(float64(l.every)/cycleNS())
	}
	el := now.Sub(l.start).Seconds()
	line := fmt.Sprintf("rdmaperf: %s %d B: %d iters", l.test, l.size, iters)
	switch {
	case l.unit == "Gb/s":
		line += fmt.Sprintf(", %.2f Gb/s", float64(iters)*float64(l.size)*8/1e9/max(el, 1e-9))
	case l.unit != "":
		line += fmt.Sprintf(", %.2f MiB/s", float64(iters)*float64(l.size)/(1<<20)/max(el, 1e-9))
	default:
		line += fmt.Sprintf(", t_avg %.2f usec", sum/float64(max(iters, 1))/1e3)
	}
	line += fmt.Sprintf(", %.1f s", el)
	if l.tty {
		fmt.Fprintf(l.w, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(l.w, line)
	}
	l.shown = true
}

// end erases the line on a terminal, before the size's row.
func (l *progressLine) end() {
	if l != nil && l.tty && l.shown {
		fmt.Fprint(l.w, "\r\x1b[K")
		l.shown = false
	}
}

// runSizes prints the header, then for each size: prepare (if any), the
// barrier with the peer, one measurement by measure (serve or client), and
// its row. Only the client prints rows, except for send_bw, whose figures
// are the receiver's.
func runSizes(p *params, o *oob, provider, device string, qps int, prepare func() error, measure func(size int) (result, error)) ([]result, error) {
	header(p.stdout, p, provider, device, qps)
	var results []result
	for step, size := range p.sizes() {
		if prepare != nil {
			if err := prepare(); err != nil {
				return nil, err
			}
		}
		if err := o.barrier(uint64(step)<<32 | uint64(size)); err != nil {
			return nil, err
		}
		r, err := measure(size)
		if err != nil {
			return nil, fmt.Errorf("%s %d B: %w", p.test, size, err)
		}
		r.Provider, r.Device = provider, device
		if p.ud {
			r.Transport = "UD"
		}
		if p.host != "" || p.test == "send_bw" {
			row(p.stdout, p, r)
			udNote(p.stdout, r)
			results = append(results, r)
		}
	}
	fmt.Fprintln(p.stdout, rule)
	return results, nil
}
