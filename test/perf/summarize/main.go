// Command summarize reads the measurements of test/perf/guest.sh (lines
// "R RUN TEST TOOL SIZE FIGURES..."), takes the median of each figure over
// the runs, and prints the ratio table of rdmaperf against perftest. It
// writes the medians and ratios as JSON, a PNG chart of each tool's
// bandwidth and latency against the message size (-png), and a PNG bar
// chart of the ratios to perftest (-ratios).
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// tools are the main table's columns. Every other tool in the input is a
// variant (async_unlocked, stream) with rows of its own.
var tools = []string{"perftest", "verbs", "async"}

// toolOrder orders the tools in the charts and the variant rows; tools not
// named here come after them, by name.
var toolOrder = []string{"perftest", "verbs", "async", "stream", "async_unlocked", "async_adaptive"}

func toolRank(t string) int {
	if i := slices.Index(toolOrder, t); i >= 0 {
		return i
	}
	return len(toolOrder)
}

func sortTools(ts []string) {
	slices.SortFunc(ts, func(a, b string) int {
		return cmp.Or(cmp.Compare(toolRank(a), toolRank(b)), strings.Compare(a, b))
	})
}

// metric is the figure a test is judged by.
type metric struct {
	name   string
	index  int  // into the figures of a row
	higher bool // higher is better
}

func metricOf(test string) metric {
	switch test {
	case "write_bw", "send_bw", "read_bw":
		return metric{"BW average [Gb/s]", 1, true}
	case "ud_send_bw": // guest.sh runs it in MiB/s (rdmaperf's two decimals)
		return metric{"BW average [MiB/s]", 1, true}
	case "write_mr", "ud_send_mr":
		return metric{"MsgRate [Mpps]", 2, true}
	}
	return metric{"t_typical [usec]", 2, false}
}

// targetsOf are the targets of issue 18 (issue 6's, and the message rate
// through Futures), as ratios to perftest, at the sizes the issue names:
// bandwidth at 64 KiB, the message rate (2 B), latency at 8 B; and
// issue 32's over UD.
func targetsOf(test string, size int) map[string]float64 {
	switch {
	case (test == "write_bw" || test == "send_bw" || test == "read_bw") && size == 64<<10:
		return map[string]float64{"verbs": 0.95, "async": 0.9}
	case test == "write_mr":
		return map[string]float64{"verbs": 0.8, "async_futures": 0.8, "async_futures_g4": 0.8}
	case (test == "send_lat" || test == "write_lat") && size == 8:
		return map[string]float64{"verbs": 1.15, "async": 1.5}
	// Over UD (issue 32, item 6): send_bw at the path MTU, whatever
	// it is (compare.sh runs it at the MTU only), the 8 B latency of
	// the async API, and the message rate with post lists.
	case test == "ud_send_bw":
		return map[string]float64{"verbs": 0.9, "async": 0.9}
	case test == "ud_send_lat" && size == 8:
		return map[string]float64{"async": 1.5}
	case test == "ud_send_mr":
		return map[string]float64{"verbs": 0.8, "async": 0.8}
	}
	return nil
}

// asyncTargetsOf are the stream's targets as ratios to the async API:
// its send_bw at 64 KiB is to reach 0.9x the async API's (issue 19), and
// its 8 B latency at most 1.2x the async API's send_lat (issue 33; issue
// 19 asked 1.5x).
func asyncTargetsOf(test string, size int) map[string]float64 {
	switch {
	case test == "send_bw" && size == 64<<10:
		return map[string]float64{"stream": 0.9}
	case test == "send_lat" && size == 8:
		return map[string]float64{"stream": 1.2}
	}
	return nil
}

type key struct {
	Test string
	Size int
}

// Point is one test and size: the medians of each tool and the ratios.
type Point struct {
	Test   string             `json:"test"`
	Size   int                `json:"size"`
	Metric string             `json:"metric"`
	Runs   map[string]int     `json:"runs"`
	Median map[string]float64 `json:"median"`
	P99    map[string]float64 `json:"p99_usec,omitempty"`
	Ratio  map[string]float64 `json:"ratio_to_perftest"`
	// RatioAsync is each variant's median divided by the async API's.
	RatioAsync map[string]float64 `json:"ratio_to_async,omitempty"`
	// Target is the wanted ratio to perftest, TargetAsync the wanted
	// ratio to the async API (the stream's); Met says for both.
	Target      map[string]float64     `json:"target,omitempty"`
	TargetAsync map[string]float64     `json:"target_to_async,omitempty"`
	Met         map[string]bool        `json:"met,omitempty"`
	Figures     map[string][][]float64 `json:"figures"`
}

// Tools are the point's tools, in toolOrder.
func (p Point) Tools() []string {
	var ts []string
	for t := range p.Figures {
		ts = append(ts, t)
	}
	sortTools(ts)
	return ts
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func parse(r io.Reader) ([]key, map[key]map[string][][]float64, []string) {
	var order []key
	data := map[key]map[string][][]float64{}
	var notes []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && (f[0] == "FAIL" || f[0] == "params:" || f[0] == "guest:") {
			notes = append(notes, sc.Text())
		}
		if len(f) < 8 || f[0] != "R" {
			continue
		}
		size, err := strconv.Atoi(f[4])
		if err != nil {
			continue
		}
		var figs []float64
		for _, x := range f[5:] {
			v, err := strconv.ParseFloat(x, 64)
			if err != nil {
				figs = nil
				break
			}
			figs = append(figs, v)
		}
		if figs == nil {
			continue
		}
		k := key{f[2], size}
		if data[k] == nil {
			data[k] = map[string][][]float64{}
			order = append(order, k)
		}
		data[k][f[3]] = append(data[k][f[3]], figs)
	}
	return order, data, notes
}

// summarize takes the medians. The points come in the order in which
// their tests first appear, each test's sizes in ascending order.
func summarize(order []key, data map[key]map[string][][]float64) []Point {
	first := map[string]int{}
	for i, k := range order {
		if _, ok := first[k.Test]; !ok {
			first[k.Test] = i
		}
	}
	order = slices.Clone(order)
	slices.SortStableFunc(order, func(a, b key) int {
		return cmp.Or(cmp.Compare(first[a.Test], first[b.Test]), cmp.Compare(a.Size, b.Size))
	})
	var pts []Point
	for _, k := range order {
		m := metricOf(k.Test)
		pt := Point{Test: k.Test, Size: k.Size, Metric: m.name, Runs: map[string]int{}, Median: map[string]float64{},
			Ratio: map[string]float64{}, Figures: data[k]}
		lat := strings.HasSuffix(k.Test, "_lat")
		if lat {
			pt.P99 = map[string]float64{}
		}
		for _, t := range tools {
			pt.Runs[t] = 0
		}
		for t, rows := range data[k] {
			pt.Runs[t] = len(rows)
			var v, p99 []float64
			for _, r := range rows {
				if m.index < len(r) {
					v = append(v, r[m.index])
				}
				if lat && len(r) > 5 {
					p99 = append(p99, r[5])
				}
			}
			if len(v) == 0 {
				continue
			}
			pt.Median[t] = median(v)
			if lat && len(p99) > 0 {
				pt.P99[t] = median(p99)
			}
		}
		for t, v := range pt.Median {
			if base := pt.Median["perftest"]; base > 0 && t != "perftest" {
				pt.Ratio[t] = v / base
			}
			if base := pt.Median["async"]; base > 0 && !slices.Contains(tools, t) {
				if pt.RatioAsync == nil {
					pt.RatioAsync = map[string]float64{}
				}
				pt.RatioAsync[t] = v / base
			}
		}
		meets := func(r float64, ok bool, want float64) bool {
			return ok && (m.higher && r >= want || !m.higher && r <= want)
		}
		for t, want := range targetsOf(k.Test, k.Size) {
			if _, ran := data[k][t]; !ran && t != "verbs" && t != "async" {
				continue // a variant's target counts only where it ran
			}
			if pt.Target == nil {
				pt.Target, pt.Met = map[string]float64{}, map[string]bool{}
			}
			pt.Target[t] = want
			r, ok := pt.Ratio[t]
			pt.Met[t] = meets(r, ok, want)
		}
		// The variants' targets count only where the variant ran.
		for t, want := range asyncTargetsOf(k.Test, k.Size) {
			if _, ran := data[k][t]; !ran {
				continue
			}
			if pt.TargetAsync == nil {
				pt.TargetAsync = map[string]float64{}
			}
			if pt.Met == nil {
				pt.Met = map[string]bool{}
			}
			pt.TargetAsync[t] = want
			r, ok := pt.RatioAsync[t]
			pt.Met[t] = meets(r, ok, want)
		}
		pts = append(pts, pt)
	}
	return pts
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func cmpSign(m metric) string {
	if m.higher {
		return "≥"
	}
	return "≤"
}

func metOrMissed(met bool) string {
	if met {
		return "met"
	}
	return "missed"
}

func table(w io.Writer, pts []Point) {
	fmt.Fprintln(w, "| test | size | metric (median) | perftest | rdmaperf verbs | rdmaperf async | verbs/perftest | async/perftest | target verbs, async | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	val := func(m map[string]float64, t string) string {
		v, ok := m[t]
		if !ok {
			return "–"
		}
		return fmt.Sprintf("%.4g", v)
	}
	ratio := func(m map[string]float64, t string) string {
		v, ok := m[t]
		if !ok {
			return "–"
		}
		return fmt.Sprintf("%.2f×", v)
	}
	for _, p := range pts {
		m := metricOf(p.Test)
		tgt, met := "–", "–"
		if p.Target != nil {
			var ts, ms []string
			for _, t := range tools[1:] {
				if want, ok := p.Target[t]; ok {
					ts = append(ts, fmt.Sprintf("%s %s%.2f", t, cmpSign(m), want))
					ms = append(ms, t+" "+metOrMissed(p.Met[t]))
				}
			}
			tgt, met = strings.Join(ts, ", "), strings.Join(ms, ", ")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.Test, sizeName(p.Size), p.Metric,
			val(p.Median, "perftest"), val(p.Median, "verbs"), val(p.Median, "async"),
			ratio(p.Ratio, "verbs"), ratio(p.Ratio, "async"), tgt, met)
	}

	// p99 of the latency tests: the main tools, and the stream if it ran.
	var lat []Point
	p99Tools := slices.Clone(tools)
	for _, p := range pts {
		if p.P99 != nil {
			lat = append(lat, p)
			if _, ok := p.P99["stream"]; ok && !slices.Contains(p99Tools, "stream") {
				p99Tools = append(p99Tools, "stream")
			}
		}
	}
	if len(lat) > 0 {
		head, rule := "| test | size | 99% percentile [usec] (median) |", "|---|---|---|"
		for _, t := range p99Tools {
			name := t
			if t != "perftest" {
				name = "rdmaperf " + t
			}
			head += " " + name + " |"
			rule += "---|"
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, head)
		fmt.Fprintln(w, rule)
		for _, p := range lat {
			fmt.Fprintf(w, "| %s | %s | |", p.Test, sizeName(p.Size))
			for _, t := range p99Tools {
				fmt.Fprintf(w, " %s |", val(p.P99, t))
			}
			fmt.Fprintln(w)
		}
	}

	// Variants beyond the three main tools (async_unlocked, stream).
	var extra []string
	var streamNotes []string
	for _, p := range pts {
		m := metricOf(p.Test)
		for _, t := range p.Tools() {
			if slices.Contains(tools, t) {
				continue
			}
			tgt, met := "–", "–"
			if want, ok := p.Target[t]; ok {
				tgt = fmt.Sprintf("%s/perftest %s%.2f", t, cmpSign(m), want)
				met = metOrMissed(p.Met[t])
			}
			if want, ok := p.TargetAsync[t]; ok {
				tgt = fmt.Sprintf("%s/async %s%.2f", t, cmpSign(m), want)
				met = metOrMissed(p.Met[t])
				r := "– (no async or " + t + " figure)"
				if v, ok := p.RatioAsync[t]; ok {
					r = fmt.Sprintf("%.2f×", v)
				}
				streamNotes = append(streamNotes, fmt.Sprintf("%s/async, %s %s (%s): %s, target %s%.2f×: %s",
					t, p.Test, sizeName(p.Size), p.Metric, r, cmpSign(m), want, met))
			}
			extra = append(extra, fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", p.Test, sizeName(p.Size), t,
				p.Metric, val(p.Median, t), ratio(p.Ratio, t), ratio(p.RatioAsync, t), tgt, met))
		}
	}
	if len(extra) > 0 {
		fmt.Fprintln(w, "\n| test | size | variant | metric (median) | value | /perftest | /async | target | met |\n|---|---|---|---|---|---|---|---|---|")
		for _, e := range extra {
			fmt.Fprintln(w, e)
		}
	}
	if len(streamNotes) > 0 {
		fmt.Fprintln(w)
		for _, n := range streamNotes {
			fmt.Fprintln(w, n)
		}
	}
	runs := 0
	for _, p := range pts {
		for _, n := range p.Runs {
			runs = max(runs, n)
		}
	}
	fmt.Fprintf(w, "\nRuns per point: up to %d; each figure is the median over them.\n", runs)
}

func writePNG(name string, img image.Image) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	err = png.Encode(f, img)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func main() {
	jsonOut := flag.String("json", "", "write medians and ratios here")
	pngOut := flag.String("png", "", "write a chart of bandwidth and latency against size here")
	ratiosOut := flag.String("ratios", "", "write a bar chart of the ratios to perftest here")
	flag.Parse()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "summarize:", err)
		os.Exit(1)
	}
	order, data, notes := parse(os.Stdin)
	pts := summarize(order, data)
	if len(pts) == 0 {
		fmt.Fprintln(os.Stderr, "summarize: no measurements in the input")
		os.Exit(1)
	}
	table(os.Stdout, pts)
	for _, n := range notes {
		fmt.Println("\n    " + n)
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(map[string]any{"points": pts, "notes": notes}, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if err != nil {
			fail(err)
		}
	}
	if *pngOut != "" {
		if err := writePNG(*pngOut, curves(pts)); err != nil {
			fail(err)
		}
	}
	if *ratiosOut != "" {
		if err := writePNG(*ratiosOut, ratioChart(pts)); err != nil {
			fail(err)
		}
	}
}
