package main

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"
)

const sample = `params: runs=3
R 1 write_bw perftest 65536 0.90 0.80 0.0015
R 1 write_bw verbs 65536 0.80 0.78 0.0014
R 2 write_bw perftest 65536 0.90 1.00 0.0015
R 2 write_bw verbs 65536 0.80 0.50 0.0014
R 3 write_bw perftest 65536 0.90 0.90 0.0015
R 3 write_bw verbs 65536 0.80 0.90 0.0014
R 3 write_bw async 65536 0.80 0.45 0.0014
T 3 write_bw async 65536 2 s
R 1 send_lat perftest 8 1 9 10 10 1 20 30
R 1 send_lat verbs 8 1 9 11 10 1 20 30
R 1 send_lat async 8 1 9 20 10 1 20 30
R 1 send_lat async_unlocked 8 1 9 15 10 1 20 30
FAIL write_mr verbs 2 (client 1, server 0)
R 1 write_mr verbs 2 garbage here 1 2 3
`

// pngRoundTrip encodes and decodes img.
func pngRoundTrip(t *testing.T, img image.Image) image.Image {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	out, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pixels counts the pixels of colour c.
func pixels(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if color.RGBAModel.Convert(img.At(x, y)) == c {
				n++
			}
		}
	}
	return n
}

func TestSummarize(t *testing.T) {
	order, data, notes := parse(strings.NewReader(sample))
	pts := summarize(order, data)
	if len(pts) != 2 || len(notes) != 2 {
		t.Fatalf("%d points, %d notes", len(pts), len(notes))
	}
	w := pts[0]
	// medians: perftest avg 0.9, verbs 0.78, async 0.45
	if w.Median["perftest"] != 0.9 || w.Median["verbs"] != 0.78 || w.Runs["verbs"] != 3 || w.Runs["async"] != 1 {
		t.Errorf("write_bw %+v", w)
	}
	if r := w.Ratio["verbs"]; r < 0.866 || r > 0.867 || w.Met["verbs"] || w.Met["async"] {
		t.Errorf("write_bw ratio %v met %v", r, w.Met)
	}
	l := pts[1]
	if l.Ratio["verbs"] != 1.1 || !l.Met["verbs"] || l.Ratio["async"] != 2 || l.Met["async"] {
		t.Errorf("send_lat ratios %v met %v", l.Ratio, l.Met)
	}
	if l.RatioAsync["async_unlocked"] != 0.75 || l.TargetAsync != nil {
		t.Errorf("send_lat async_unlocked/async %v, target %v", l.RatioAsync, l.TargetAsync)
	}
	var out bytes.Buffer
	table(&out, pts)
	for _, want := range []string{"| write_bw | 64 KiB |", "0.87×", "verbs missed", "verbs met, async missed", "Runs per point: up to 3",
		"| send_lat | 8 B | async_unlocked | t_typical [usec] | 15 | 1.50× | 0.75× | – | – |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	for _, unwanted := range []string{"stream"} {
		if strings.Contains(out.String(), unwanted) {
			t.Errorf("table has %q without a stream measurement:\n%s", unwanted, out.String())
		}
	}
	if img := pngRoundTrip(t, curves(pts)); pixels(img, toolColors["verbs"]) == 0 || pixels(img, toolColors["stream"]) != 0 {
		t.Error("the curves lack the verbs API or draw a stream that did not run")
	}
	pngRoundTrip(t, ratioChart(pts))
}

// Latency at several sizes (given out of order), bandwidth at two, and
// the stream on send_bw and send_lat.
const multi = `params: runs=2 synthetic
R 1 send_lat perftest 64 1 99 20 20 1 40 50
R 1 send_lat verbs 64 1 99 30 30 1 60 70
R 1 send_lat async 64 1 99 100 100 1 200 300
R 1 send_lat stream 64 1 99 60 60 1 150 200
R 1 send_lat perftest 8 1 99 10 10 1 20 30
R 1 send_lat verbs 8 1 99 11 11 1 22 33
R 1 send_lat async 8 1 99 14 14 1 28 42
R 1 send_lat stream 8 1 99 40 40 1 80 120
R 1 send_lat async_unlocked 8 1 99 12 12 1 24 36
R 1 write_lat perftest 8 1 99 10 10 1 20 30
R 1 write_lat verbs 8 1 99 12 12 1 24 36
R 1 write_lat perftest 4096 1 99 50 50 1 70 90
R 1 write_lat verbs 4096 1 99 55 55 1 80 99
R 1 send_bw perftest 65536 0.00 0.40 0.0008
R 1 send_bw verbs 65536 0.40 0.38 0.0007
R 1 send_bw async 65536 0.30 0.30 0.0006
R 1 send_bw stream 65536 0.30 0.27 0.0005
R 2 send_bw perftest 65536 0.00 0.40 0.0008
R 2 send_bw verbs 65536 0.40 0.38 0.0007
R 2 send_bw async 65536 0.30 0.30 0.0006
R 2 send_bw stream 65536 0.30 0.21 0.0005
R 1 send_bw perftest 4096 0.00 0.10 0.003
R 1 send_bw verbs 4096 0.10 0.10 0.003
R 1 send_bw async 4096 0.05 0.05 0.0015
R 1 send_bw stream 4096 0.05 0.06 0.0015
`

func TestMultiSizeAndStream(t *testing.T) {
	order, data, _ := parse(strings.NewReader(multi))
	pts := summarize(order, data)
	var got []string
	byName := map[string]Point{}
	for _, p := range pts {
		n := p.Test + " " + sizeName(p.Size)
		got = append(got, n)
		byName[n] = p
	}
	want := "send_lat 8 B,send_lat 64 B,write_lat 8 B,write_lat 4 KiB,send_bw 4 KiB,send_bw 64 KiB"
	if strings.Join(got, ",") != want {
		t.Fatalf("points %v, want %s", got, want)
	}
	// Targets at the sizes only: latency 8 B, bandwidth 64 KiB.
	if p := byName["send_lat 8 B"]; p.Target["verbs"] != 1.15 || !p.Met["verbs"] || p.Met["async"] == (p.Ratio["async"] > 1.5) {
		t.Errorf("send_lat 8 B: target %v met %v ratio %v", p.Target, p.Met, p.Ratio)
	}
	if p := byName["send_lat 8 B"]; p.TargetAsync["stream"] != 1.2 || p.Met["stream"] {
		t.Errorf("send_lat 8 B stream: %+v", p)
	}
	for _, n := range []string{"send_lat 64 B", "write_lat 4 KiB", "send_bw 4 KiB"} {
		if p := byName[n]; p.Target != nil || p.TargetAsync != nil || p.Met != nil {
			t.Errorf("%s has targets %v %v %v", n, p.Target, p.TargetAsync, p.Met)
		}
	}
	if p := byName["send_lat 64 B"]; p.Ratio["verbs"] != 1.5 || p.Ratio["stream"] != 3 || p.RatioAsync["stream"] != 0.6 || p.P99["stream"] != 150 {
		t.Errorf("send_lat 64 B: ratios %v, to async %v, p99 %v", p.Ratio, p.RatioAsync, p.P99)
	}
	// The stream: median 0.24 Gb/s against the async API's 0.30 = 0.8x,
	// short of issue 19's 0.9x.
	sb := byName["send_bw 64 KiB"]
	if sb.Median["stream"] != 0.24 || sb.Runs["stream"] != 2 || sb.TargetAsync["stream"] != 0.9 || sb.Met["stream"] {
		t.Errorf("send_bw 64 KiB stream: %+v", sb)
	}
	if r := sb.RatioAsync["stream"]; r < 0.7999 || r > 0.8001 {
		t.Errorf("stream/async %v, want 0.8", r)
	}
	if _, ok := sb.Target["stream"]; ok {
		t.Errorf("the stream has a target against perftest: %v", sb.Target)
	}

	var out bytes.Buffer
	table(&out, pts)
	for _, want := range []string{
		"| send_lat | 8 B | t_typical [usec] | 10 | 11 | 14 | 1.10× | 1.40× | verbs ≤1.15, async ≤1.50 | verbs met, async met |",
		"| send_lat | 64 B | t_typical [usec] | 20 | 30 | 100 | 1.50× | 5.00× | – | – |",
		"| write_lat | 4 KiB | t_typical [usec] | 50 | 55 | – | 1.10× | – | – | – |",
		"| test | size | 99% percentile [usec] (median) | perftest | rdmaperf verbs | rdmaperf async | rdmaperf stream |",
		"| send_lat | 64 B | | 40 | 60 | 200 | 150 |",
		"| write_lat | 8 B | | 20 | 24 | – | – |",
		"| send_bw | 64 KiB | stream | BW average [Gb/s] | 0.24 | 0.60× | 0.80× | stream/async ≥0.90 | missed |",
		"| send_bw | 4 KiB | stream | BW average [Gb/s] | 0.06 | 0.60× | 1.20× | – | – |",
		"| send_lat | 8 B | stream | t_typical [usec] | 40 | 4.00× | 2.86× | stream/async ≤1.20 | missed |",
		"stream/async, send_bw 64 KiB (BW average [Gb/s]): 0.80×, target ≥0.90×: missed",
		"Runs per point: up to 2",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}

	// The stream's curves and bars are drawn in its colour; a chart with
	// latency only says so in the empty bandwidth panel.
	img := pngRoundTrip(t, curves(pts))
	for _, tool := range []string{"perftest", "verbs", "async", "stream", "async_unlocked"} {
		if pixels(img, toolColors[tool]) == 0 {
			t.Errorf("curves: no pixel of %s", tool)
		}
	}
	if pixels(pngRoundTrip(t, ratioChart(pts)), toolColors["stream"]) == 0 {
		t.Error("ratios: no stream bar")
	}
	order, data, _ = parse(strings.NewReader("R 1 write_lat perftest 8 1 99 10 10 1 20 30\n"))
	pngRoundTrip(t, curves(summarize(order, data)))
}

func TestAxes(t *testing.T) {
	for _, c := range []struct{ lo, hi, wantLo, wantHi float64 }{
		{0.13, 0.27, 0.1, 0.5},
		{18, 200, 10, 500},
		{20, 20, 10, 50}, // one value: still a range
		{0.03, 0.45, 0.02, 0.5},
	} {
		if lo, hi := niceRange(c.lo, c.hi); lo != c.wantLo || hi != c.wantHi {
			t.Errorf("niceRange(%v, %v) = %v, %v; want %v, %v", c.lo, c.hi, lo, hi, c.wantLo, c.wantHi)
		}
	}
	for v, want := range map[float64]string{0.05: "0.05", 0.2: "0.2", 1: "1", 500: "500", 2000: "2000"} {
		if got := tickLabel(v); got != want {
			t.Errorf("tickLabel(%v) = %q, want %q", v, got, want)
		}
	}
	// Zero medians (perftest's send_bw peak) cannot go on a log axis.
	ss := seriesOf([]Point{{Test: "send_bw", Size: 8, Median: map[string]float64{"perftest": 0, "verbs": 1},
		Figures: map[string][][]float64{"perftest": nil, "verbs": nil}}}, isBW)
	if len(ss) != 1 || ss[0].tool != "verbs" {
		t.Errorf("series %+v", ss)
	}
}

// TestVariantTargets: the message rate through Futures has issue 18's
// target where it ran, and none where it did not.
func TestVariantTargets(t *testing.T) {
	in := `R 1 write_mr perftest 2 0.001 0.001 0.030
R 1 write_mr verbs 2 0.001 0.001 0.027
R 1 write_mr async_futures 2 0.001 0.001 0.009
`
	order, data, _ := parse(strings.NewReader(in))
	pts := summarize(order, data)
	if len(pts) != 1 {
		t.Fatalf("%d points", len(pts))
	}
	p := pts[0]
	if p.Target["async_futures"] != 0.8 || p.Met["async_futures"] || !p.Met["verbs"] {
		t.Errorf("targets %v, met %v", p.Target, p.Met)
	}
	if _, ok := p.Target["async_futures_g4"]; ok {
		t.Errorf("a target for a variant that did not run: %v", p.Target)
	}
	var b bytes.Buffer
	table(&b, pts)
	if want := "| write_mr | 2 B | async_futures | MsgRate [Mpps] | 0.009 | 0.30× | – | async_futures/perftest ≥0.80 | missed |"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}

// TestUDTargets: the UD points have issue 32's targets: send_bw at the
// MTU (any size), the async API's 8 B latency, the message rate.
func TestUDTargets(t *testing.T) {
	in := `R 1 ud_send_bw perftest 1024 1.0 1.00 0.12
R 1 ud_send_bw verbs 1024 1.0 0.95 0.11
R 1 ud_send_bw async 1024 1.0 0.50 0.06
R 1 ud_send_mr perftest 2 0.001 0.001 0.500
R 1 ud_send_mr async 2 0.001 0.001 0.450
R 1 ud_send_lat perftest 8 1 9 10 10 1 20 30
R 1 ud_send_lat async 8 1 9 20 10 1 20 30
`
	order, data, _ := parse(strings.NewReader(in))
	pts := summarize(order, data)
	if len(pts) != 3 {
		t.Fatalf("%d points", len(pts))
	}
	bw, mr, lat := pts[0], pts[1], pts[2]
	if bw.Metric != "BW average [MiB/s]" || !bw.Met["verbs"] || bw.Met["async"] || bw.Target["async"] != 0.9 {
		t.Errorf("ud_send_bw: %s, targets %v, met %v", bw.Metric, bw.Target, bw.Met)
	}
	if mr.Metric != "MsgRate [Mpps]" || !mr.Met["async"] || mr.Met["verbs"] {
		t.Errorf("ud_send_mr: %s, targets %v, met %v (verbs did not run)", mr.Metric, mr.Target, mr.Met)
	}
	if lat.Target["async"] != 1.5 || lat.Met["async"] {
		t.Errorf("ud_send_lat: targets %v, met %v (2x)", lat.Target, lat.Met)
	}
}
