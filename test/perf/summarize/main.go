// Command summarize reads the measurements of test/perf/guest.sh (lines
// "R RUN TEST TOOL SIZE FIGURES..."), takes the median of each figure over
// the runs, and prints the ratio table of rdmaperf against perftest. It
// writes the medians and ratios as JSON and a PNG chart of the ratios.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

var tools = []string{"perftest", "verbs", "async"}

// metric is the figure a test is judged by.
type metric struct {
	name   string
	index  int  // into the figures of a row
	higher bool // higher is better
	verbs  float64
	async  float64 // targets, 0 = none
}

func metricOf(test string) metric {
	switch test {
	case "write_bw", "send_bw":
		return metric{"BW average [Gb/s]", 1, true, 0.95, 0.9}
	case "read_bw":
		return metric{"BW average [Gb/s]", 1, true, 0, 0}
	case "write_mr":
		return metric{"MsgRate [Mpps]", 2, true, 0.8, 0}
	case "send_lat", "write_lat":
		return metric{"t_typical [usec]", 2, false, 1.15, 1.5}
	}
	return metric{"t_typical [usec]", 2, false, 0, 0}
}

type key struct {
	Test string
	Size int
}

// Point is one test and size: the medians of each tool and the ratios.
type Point struct {
	Test    string                 `json:"test"`
	Size    int                    `json:"size"`
	Metric  string                 `json:"metric"`
	Runs    map[string]int         `json:"runs"`
	Median  map[string]float64     `json:"median"`
	P99     map[string]float64     `json:"p99_usec,omitempty"`
	Ratio   map[string]float64     `json:"ratio_to_perftest"`
	Target  map[string]float64     `json:"target,omitempty"`
	Met     map[string]bool        `json:"met,omitempty"`
	Figures map[string][][]float64 `json:"figures"`
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

func summarize(order []key, data map[key]map[string][][]float64) []Point {
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
			rows := data[k][t]
			pt.Runs[t] = len(rows)
			if len(rows) == 0 {
				continue
			}
			var v, p99 []float64
			for _, r := range rows {
				if m.index < len(r) {
					v = append(v, r[m.index])
				}
				if lat && len(r) > 5 {
					p99 = append(p99, r[5])
				}
			}
			pt.Median[t] = median(v)
			if lat {
				pt.P99[t] = median(p99)
			}
		}
		if base := pt.Median["perftest"]; base > 0 {
			for _, t := range tools[1:] {
				if v, ok := pt.Median[t]; ok {
					pt.Ratio[t] = v / base
				}
			}
		}
		for t, want := range map[string]float64{"verbs": m.verbs, "async": m.async} {
			if want == 0 {
				continue
			}
			if pt.Target == nil {
				pt.Target, pt.Met = map[string]float64{}, map[string]bool{}
			}
			pt.Target[t] = want
			r, ok := pt.Ratio[t]
			pt.Met[t] = ok && (m.higher && r >= want || !m.higher && r <= want)
		}
		pts = append(pts, pt)
	}
	return pts
}

// column is the figure at index i of every row.
func column(rows [][]float64, i int) []float64 {
	var v []float64
	for _, r := range rows {
		if i < len(r) {
			v = append(v, r[i])
		}
	}
	return v
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

func table(w io.Writer, pts []Point) {
	fmt.Fprintln(w, "| test | size | metric (median) | perftest | rdmaperf verbs | rdmaperf async | verbs/perftest | async/perftest | target verbs, async | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, p := range pts {
		m := metricOf(p.Test)
		tgt, met := "–", "–"
		if p.Target != nil {
			cmp := "≥"
			if !m.higher {
				cmp = "≤"
			}
			var ts, ms []string
			for _, t := range tools[1:] {
				if want, ok := p.Target[t]; ok {
					ts = append(ts, fmt.Sprintf("%s %s%.2f", t, cmp, want))
					ok := "missed"
					if p.Met[t] {
						ok = "met"
					}
					ms = append(ms, t+" "+ok)
				}
			}
			tgt, met = strings.Join(ts, ", "), strings.Join(ms, ", ")
		}
		f := func(t string) string {
			v, ok := p.Median[t]
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.4g", v)
		}
		r := func(t string) string {
			v, ok := p.Ratio[t]
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.2f×", v)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", p.Test, sizeName(p.Size), p.Metric,
			f("perftest"), f("verbs"), f("async"), r("verbs"), r("async"), tgt, met)
	}
	var lat []Point
	for _, p := range pts {
		if p.P99 != nil {
			lat = append(lat, p)
		}
	}
	if len(lat) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| test | size | 99% percentile [usec] (median) | perftest | rdmaperf verbs | rdmaperf async |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for _, p := range lat {
			fmt.Fprintf(w, "| %s | %s | | %.4g | %.4g | %.4g |\n", p.Test, sizeName(p.Size), p.P99["perftest"], p.P99["verbs"], p.P99["async"])
		}
	}
	// Variants beyond the three main tools (e.g. async_unlocked).
	var extra []string
	for _, p := range pts {
		for t := range p.Figures {
			if !slices.Contains(tools, t) {
				extra = append(extra, fmt.Sprintf("| %s | %s | %s | %s | %.4g | %.2f× |", p.Test, sizeName(p.Size), t, p.Metric,
					median(column(p.Figures[t], metricOf(p.Test).index)), median(column(p.Figures[t], metricOf(p.Test).index))/p.Median["perftest"]))
			}
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		fmt.Fprintln(w, "\n| test | size | variant | metric (median) | value | /perftest |\n|---|---|---|---|---|---|")
		for _, e := range extra {
			fmt.Fprintln(w, e)
		}
	}
	runs := 0
	for _, p := range pts {
		runs = max(runs, p.Runs["perftest"], p.Runs["verbs"], p.Runs["async"])
	}
	fmt.Fprintf(w, "\nRuns per point: up to %d; each figure is the median over them.\n", runs)
}

func main() {
	jsonOut := flag.String("json", "", "write medians and ratios here")
	pngOut := flag.String("png", "", "write a chart of the ratios here")
	flag.Parse()
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
			fmt.Fprintln(os.Stderr, "summarize:", err)
			os.Exit(1)
		}
	}
	if *pngOut != "" {
		f, err := os.Create(*pngOut)
		if err == nil {
			err = png.Encode(f, chart(pts))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "summarize:", err)
			os.Exit(1)
		}
	}
}

var (
	white  = color.RGBA{255, 255, 255, 255}
	black  = color.RGBA{0, 0, 0, 255}
	grey   = color.RGBA{200, 200, 200, 255}
	red    = color.RGBA{200, 30, 30, 255}
	colors = map[string]color.RGBA{"perftest": {120, 120, 120, 255}, "verbs": {40, 90, 200, 255}, "async": {240, 140, 20, 255}}
)

// chart draws, for each test and size, the median of every tool divided
// by perftest's (perftest = 1), with the targets as red marks.
// For latency lower is better, for bandwidth higher.
func chart(pts []Point) image.Image {
	const W, H, left, top, bottom = 1000, 460, 60, 40, 80
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, 0, 0, W, H, white)
	// The axis stops at 3x; taller bars are cut and carry their value.
	maxR := 1.5
	for _, p := range pts {
		for _, r := range p.Ratio {
			maxR = max(maxR, min(r, 3))
		}
	}
	maxR = float64(int(maxR*2)+1) / 2
	plotH := H - top - bottom
	y := func(r float64) int { return top + plotH - int(r/maxR*float64(plotH)) }
	for r := 0.0; r <= maxR+1e-9; r += 0.5 {
		c := grey
		if r == 1 {
			c = black
		}
		fill(img, left, y(r), W-10, y(r)+1, c)
		text(img, 8, y(r)-5, fmt.Sprintf("%.1fX", r), black, 2)
	}
	text(img, left, 10, "RDMAPERF / PERFTEST, MEDIANS, SAME VM (LAT: LOWER IS BETTER)", black, 2)
	lx := W - 330
	for i, t := range tools {
		fill(img, lx+i*110, 12, lx+i*110+14, 24, colors[t])
		text(img, lx+i*110+18, 13, strings.ToUpper(t), black, 2)
	}
	group := (W - left - 20) / len(pts)
	bar := min(40, group/4)
	for i, p := range pts {
		x0 := left + 10 + i*group + (group-3*bar)/2
		for j, t := range tools {
			r := 1.0
			if t != "perftest" {
				var ok bool
				if r, ok = p.Ratio[t]; !ok {
					continue
				}
			}
			if r > maxR {
				text(img, x0+j*bar, top-12+(j%2)*8, fmt.Sprintf("%.1fX", r), black, 1)
				r = maxR
			}
			fill(img, x0+j*bar+2, y(r), x0+(j+1)*bar-2, y(0), colors[t])
			if want, ok := p.Target[t]; ok {
				fill(img, x0+j*bar, y(want)-1, x0+(j+1)*bar, y(want)+2, red)
			}
		}
		name := strings.ToUpper(strings.ReplaceAll(p.Test, "_", " "))
		text(img, x0-10, y(0)+10, name, black, 2)
		text(img, x0-10, y(0)+26, strings.ToUpper(strings.ReplaceAll(sizeName(p.Size), "i", "I")), black, 2)
	}
	text(img, left, H-22, "RED MARK: ISSUE 6 TARGET. SOFT-ROCE UNDER QEMU TCG: RATIOS ONLY, NOT HARDWARE SPEED", black, 2)
	return img
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	for y := max(y0, 0); y < y1 && y < img.Rect.Dy(); y++ {
		for x := max(x0, 0); x < x1 && x < img.Rect.Dx(); x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

// font is a 3x5 pixel font: each glyph is five rows of three bits.
var font = map[rune][5]string{
	'0': {"111", "101", "101", "101", "111"}, '1': {"010", "110", "010", "010", "111"},
	'2': {"111", "001", "111", "100", "111"}, '3': {"111", "001", "111", "001", "111"},
	'4': {"101", "101", "111", "001", "001"}, '5': {"111", "100", "111", "001", "111"},
	'6': {"111", "100", "111", "101", "111"}, '7': {"111", "001", "010", "010", "010"},
	'8': {"111", "101", "111", "101", "111"}, '9': {"111", "101", "111", "001", "111"},
	'A': {"010", "101", "111", "101", "101"}, 'B': {"110", "101", "110", "101", "110"},
	'C': {"011", "100", "100", "100", "011"}, 'D': {"110", "101", "101", "101", "110"},
	'E': {"111", "100", "110", "100", "111"}, 'F': {"111", "100", "110", "100", "100"},
	'G': {"011", "100", "101", "101", "011"}, 'H': {"101", "101", "111", "101", "101"},
	'I': {"111", "010", "010", "010", "111"}, 'J': {"001", "001", "001", "101", "010"},
	'K': {"101", "101", "110", "101", "101"}, 'L': {"100", "100", "100", "100", "111"},
	'M': {"101", "111", "111", "101", "101"}, 'N': {"110", "101", "101", "101", "101"},
	'O': {"010", "101", "101", "101", "010"}, 'P': {"110", "101", "110", "100", "100"},
	'Q': {"010", "101", "101", "110", "011"}, 'R': {"110", "101", "110", "101", "101"},
	'S': {"011", "100", "010", "001", "110"}, 'T': {"111", "010", "010", "010", "010"},
	'U': {"101", "101", "101", "101", "111"}, 'V': {"101", "101", "101", "101", "010"},
	'W': {"101", "101", "111", "111", "101"}, 'X': {"101", "101", "010", "101", "101"},
	'Y': {"101", "101", "010", "010", "010"}, 'Z': {"111", "001", "010", "100", "111"},
	'.': {"000", "000", "000", "000", "010"}, ',': {"000", "000", "000", "010", "100"},
	'/': {"001", "001", "010", "100", "100"}, '-': {"000", "000", "111", "000", "000"},
	':': {"000", "010", "000", "010", "000"}, '(': {"001", "010", "010", "010", "001"},
	')': {"100", "010", "010", "010", "100"}, '=': {"000", "111", "000", "111", "000"},
}

func text(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for _, r := range s {
		if g, ok := font[r]; ok {
			for row := 0; row < 5; row++ {
				for col := 0; col < 3; col++ {
					if g[row][col] == '1' {
						fill(img, x+col*scale, y+row*scale, x+(col+1)*scale, y+(row+1)*scale, c)
					}
				}
			}
		}
		x += 4 * scale
	}
}
