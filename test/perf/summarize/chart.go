package main

import (
	"cmp"
	"fmt"
	"image"
	"image/color"
	"math"
	"slices"
	"strings"
)

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{200, 200, 200, 255}
	light = color.RGBA{232, 232, 232, 255}
	dark  = color.RGBA{70, 70, 70, 255}
	red   = color.RGBA{200, 30, 30, 255}
	// toolColors are the tools' colours in both charts; other tools get
	// spareColors in toolOrder.
	toolColors = map[string]color.RGBA{
		"perftest": {110, 110, 110, 255}, "verbs": {40, 90, 200, 255}, "async": {240, 140, 20, 255},
		"stream": {20, 160, 70, 255}, "async_unlocked": {170, 70, 190, 255}, "async_adaptive": {200, 170, 0, 255},
	}
	spareColors = []color.RGBA{{200, 40, 40, 255}, {0, 160, 170, 255}, {150, 110, 60, 255}, {230, 80, 160, 255}}
)

// colorsFor gives every tool of ts its colour.
func colorsFor(ts []string) map[string]color.RGBA {
	c := map[string]color.RGBA{}
	spare := 0
	for _, t := range ts {
		if tc, ok := toolColors[t]; ok {
			c[t] = tc
		} else {
			c[t] = spareColors[spare%len(spareColors)]
			spare++
		}
	}
	return c
}

const (
	markSquare = iota
	markDiamond
	markTriangle
	markCircle
)

// style is how a test's curve is drawn: dash pattern (on, off, ... in
// pixels; nil = solid) and marker, by operation.
type style struct {
	dash   []float64
	marker int
}

func opOf(test string) string { return strings.SplitN(test, "_", 2)[0] }

func opStyle(op string) style {
	switch op {
	case "write":
		return style{nil, markSquare}
	case "send":
		return style{[]float64{9, 5}, markDiamond}
	case "read":
		return style{[]float64{2, 4}, markTriangle}
	}
	return style{[]float64{12, 4, 2, 4}, markCircle}
}

// series is one tool's medians of one test against the size.
type series struct {
	test, tool string
	sizes      []int
	values     []float64
}

// seriesOf collects, for the tests that keep, each tool's median per size
// (ascending; the points are sorted so). Zero and negative medians have
// no place on a log axis and are left out.
func seriesOf(pts []Point, keep func(test string) bool) []series {
	idx := map[[2]string]int{}
	var ss []series
	for _, p := range pts {
		if !keep(p.Test) {
			continue
		}
		for _, t := range p.Tools() {
			v, ok := p.Median[t]
			if !ok || !(v > 0) || math.IsInf(v, 0) {
				continue
			}
			k := [2]string{p.Test, t}
			i, ok := idx[k]
			if !ok {
				i = len(ss)
				idx[k] = i
				ss = append(ss, series{test: p.Test, tool: t})
			}
			ss[i].sizes = append(ss[i].sizes, p.Size)
			ss[i].values = append(ss[i].values, v)
		}
	}
	return ss
}

// isBW: the bandwidth tests in Gb/s; ud_send_bw is in MiB/s (guest.sh),
// in the table and the ratio chart only.
func isBW(test string) bool {
	return strings.HasSuffix(test, "_bw") && !strings.HasPrefix(test, "ud_")
}

func isLat(test string) bool { return strings.HasSuffix(test, "_lat") }

// curves draws two panels against the message size (log2 x axis, log y
// axis): left the BW average of the bandwidth tests (not the message-rate
// point, which runs with post lists), right t_typical of the latency
// tests. Colour is the tool, line and marker the operation. Each tool's
// points are shifted a few pixels sideways so that equal values stay
// visible; with one size a panel shows points only, each series in a
// column of its own.
func curves(pts []Point) image.Image {
	const W, H = 1400, 640
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, 0, 0, W, H, white)
	bw, lat := seriesOf(pts, isBW), seriesOf(pts, isLat)

	var ts, ops []string
	runs := 0
	for _, s := range slices.Concat(bw, lat) {
		if !slices.Contains(ts, s.tool) {
			ts = append(ts, s.tool)
		}
		if !slices.Contains(ops, opOf(s.test)) {
			ops = append(ops, opOf(s.test))
		}
	}
	for _, p := range pts {
		for _, n := range p.Runs {
			runs = max(runs, n)
		}
	}
	sortTools(ts)
	slices.SortFunc(ops, func(a, b string) int { return opStyle(a).marker - opStyle(b).marker })
	colors := colorsFor(ts)

	text(img, 20, 12, fmt.Sprintf("RDMAPERF AND PERFTEST AGAINST MESSAGE SIZE: MEDIANS OVER UP TO %d RUNS, ONE VM", runs), black, 2)
	// legend: tools, then operations
	x := 20
	text(img, x, 40, "TOOL:", black, 2)
	x += textWidth("TOOL:", 2) + 14
	for _, t := range ts {
		line(img, float64(x), 45, float64(x+30), 45, 3, colors[t], nil)
		marker(img, x+15, 45, markSquare, colors[t])
		text(img, x+38, 40, t, black, 2)
		x += 38 + textWidth(t, 2) + 24
	}
	x += 20
	text(img, x, 40, "OPERATION:", black, 2)
	x += textWidth("OPERATION:", 2) + 14
	for _, op := range ops {
		st := opStyle(op)
		line(img, float64(x), 45, float64(x+40), 45, 2, dark, st.dash)
		marker(img, x+20, 45, st.marker, dark)
		text(img, x+48, 40, op, black, 2)
		x += 48 + textWidth(op, 2) + 24
	}

	top, bottom := 110, H-90
	panel(img, 90, top, W/2-40, bottom, "BANDWIDTH: BW AVERAGE [GBIT/S], HIGHER IS BETTER", bw, ts, colors)
	panel(img, W/2+90, top, W-40, bottom, "LATENCY: T_TYPICAL [USEC], LOWER IS BETTER", lat, ts, colors)
	text(img, 20, H-34, "LOG SCALES. SEND_BW: THE RECEIVER FIGURES. SEND/WRITE_LAT: HALF THE ROUND TRIP, T_TYPICAL = MEDIAN SAMPLE.", black, 2)
	text(img, 20, H-16, "SOFT-ROCE UNDER QEMU TCG: COMPARE THE TOOLS, NOT HARDWARE SPEED. TABLE AND RATIOS: TABLE.MD, RATIOS.PNG", black, 2)
	return img
}

// logAxis maps values in [lo, hi] (log scale) onto pixels p0..p1.
type logAxis struct {
	lo, hi float64
	p0, p1 float64
}

func (a logAxis) pos(v float64) float64 {
	return a.p0 + math.Log(v/a.lo)/math.Log(a.hi/a.lo)*(a.p1-a.p0)
}

// steps125 are the values 1, 2, 5 times a power of ten from one below lo
// to one above hi.
func steps125(lo, hi float64) []float64 {
	var s []float64
	for e := math.Floor(math.Log10(lo)) - 1; e <= math.Ceil(math.Log10(hi))+1; e++ {
		for _, m := range []float64{1, 2, 5} {
			s = append(s, m*math.Pow(10, e))
		}
	}
	return s
}

// niceRange widens [lo, hi] to the nearest 1-2-5 values, with a margin
// so that no point sits on the frame.
func niceRange(lo, hi float64) (float64, float64) {
	lo, hi = lo/1.08, hi*1.08
	s := steps125(lo, hi)
	nlo, nhi := s[0], s[len(s)-1]
	for _, v := range s {
		if v <= lo*(1+1e-9) {
			nlo = v
		}
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] >= hi*(1-1e-9) {
			nhi = s[i]
		}
	}
	return nlo, nhi
}

func tickLabel(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.*f", int(math.Ceil(-math.Log10(v)-1e-9)), v)
}

func panel(img *image.RGBA, x0, y0, x1, y1 int, title string, ss []series, order []string, colors map[string]color.RGBA) {
	text(img, x0, y0-30, title, black, 2)
	if len(ss) == 0 {
		frame(img, x0, y0, x1, y1, black)
		text(img, (x0+x1)/2-textWidth("NO MEASUREMENTS", 2)/2, (y0+y1)/2, "NO MEASUREMENTS", dark, 2)
		return
	}
	minS, maxS := math.MaxInt, 0
	minV, maxV := math.Inf(1), math.Inf(-1)
	var ts []string
	for _, s := range ss {
		for i, n := range s.sizes {
			minS, maxS = min(minS, n), max(maxS, n)
			minV, maxV = min(minV, s.values[i]), max(maxV, s.values[i])
		}
		if !slices.Contains(ts, s.tool) {
			ts = append(ts, s.tool)
		}
	}
	slices.SortFunc(ts, func(a, b string) int { return slices.Index(order, a) - slices.Index(order, b) })
	xa := logAxis{float64(minS) / math.Sqrt2, float64(maxS) * math.Sqrt2, float64(x0), float64(x1)}
	if minS == maxS {
		xa.lo, xa.hi = float64(minS)/2, float64(maxS)*2
	}
	lo, hi := niceRange(minV, maxV)
	ya := logAxis{lo, hi, float64(y1), float64(y0)}

	// grid and y labels: 1-2-5 steps, a label where there is room
	last := math.Inf(1)
	for _, v := range steps125(lo, hi) {
		if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
			continue
		}
		y := int(math.Round(ya.pos(v)))
		c := light
		if m := v / math.Pow(10, math.Floor(math.Log10(v)+1e-9)); math.Abs(m-1) < 1e-6 {
			c = grey
		}
		fill(img, x0, y, x1, y+1, c)
		if last-float64(y) >= 18 {
			l := tickLabel(v)
			text(img, x0-8-textWidth(l, 2), y-5, l, black, 2)
			last = float64(y)
		}
	}
	// x grid at the powers of two; labels at the measured sizes first,
	// then at the other powers of two where there is room
	var sizes, ticks []int
	for _, s := range ss {
		for _, n := range s.sizes {
			if !slices.Contains(sizes, n) {
				sizes = append(sizes, n)
			}
		}
	}
	slices.Sort(sizes)
	for e := math.Ceil(math.Log2(xa.lo)); math.Pow(2, e) <= xa.hi; e++ {
		n := int(math.Pow(2, e))
		ticks = append(ticks, n)
		x := int(math.Round(xa.pos(float64(n))))
		fill(img, x, y0, x+1, y1, light)
	}
	var taken [][2]int // label extents
	for _, n := range slices.Concat(sizes, ticks) {
		l := sizeName(n)
		x := int(math.Round(xa.pos(float64(n))))
		a, b := x-textWidth(l, 2)/2, x+textWidth(l, 2)/2
		if slices.ContainsFunc(taken, func(t [2]int) bool { return a < t[1]+14 && b > t[0]-14 }) {
			continue
		}
		taken = append(taken, [2]int{a, b})
		fill(img, x, y1, x+1, y1+6, black)
		text(img, a, y1+10, l, black, 2)
	}
	text(img, (x0+x1)/2-textWidth("MESSAGE SIZE", 2)/2, y1+32, "MESSAGE SIZE", black, 2)
	frame(img, x0, y0, x1, y1, black)

	// Sideways shifts: a few pixels per tool; with one size, a column per
	// series (tool, then operation) so that no marker hides another.
	ss = slices.Clone(ss)
	slices.SortStableFunc(ss, func(a, b series) int {
		return cmp.Or(slices.Index(ts, a.tool)-slices.Index(ts, b.tool), opStyle(opOf(a.test)).marker-opStyle(opOf(b.test)).marker)
	})
	shift := func(i int) float64 {
		if minS == maxS {
			return (float64(i) - float64(len(ss)-1)/2) * 14
		}
		return (float64(slices.Index(ts, ss[i].tool)) - float64(len(ts)-1)/2) * 5
	}
	for k, s := range ss {
		st := opStyle(opOf(s.test))
		for i := 1; i < len(s.sizes); i++ {
			line(img, xa.pos(float64(s.sizes[i-1]))+shift(k), ya.pos(s.values[i-1]),
				xa.pos(float64(s.sizes[i]))+shift(k), ya.pos(s.values[i]), 2, colors[s.tool], st.dash)
		}
	}
	for k, s := range ss {
		st := opStyle(opOf(s.test))
		for i, n := range s.sizes {
			marker(img, int(math.Round(xa.pos(float64(n))+shift(k))), int(math.Round(ya.pos(s.values[i]))), st.marker, colors[s.tool])
		}
	}
}

// ratioChart draws, for each test and size, the median of every tool
// divided by perftest's (perftest = 1), with issue 18's targets as red
// marks (the stream's at 0.9 or 1.2 times the async bar). For
// latency lower is better, for bandwidth higher.
func ratioChart(pts []Point) image.Image {
	slots := slices.Clone(tools)
	for _, p := range pts {
		if _, ok := p.Figures["stream"]; ok && !slices.Contains(slots, "stream") {
			slots = append(slots, "stream")
		}
	}
	const H, left, top, bottom = 460, 60, 40, 80
	group := max(len(slots)*24+34, 100)
	W := max(1000, left+20+len(pts)*group)
	group = (W - left - 20) / len(pts)
	colors := colorsFor(slots)
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, 0, 0, W, H, white)
	// The axis stops at 3x; taller bars are cut and carry their value.
	maxR := 1.5
	for _, p := range pts {
		for _, t := range slots {
			if r, ok := p.Ratio[t]; ok {
				maxR = max(maxR, min(r, 3))
			}
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
	lx := W - 10 - 110*len(slots)
	for i, t := range slots {
		fill(img, lx+i*110, 12, lx+i*110+14, 24, colors[t])
		text(img, lx+i*110+18, 13, t, black, 2)
	}
	bar := min(40, group/(len(slots)+1))
	for i, p := range pts {
		x0 := left + 10 + i*group + (group-len(slots)*bar)/2
		for j, t := range slots {
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
			want, ok := p.Target[t]
			if wa, okA := p.TargetAsync[t]; okA {
				ra, okR := p.Ratio["async"]
				want, ok = wa*ra, okR
			}
			if ok && want <= maxR {
				fill(img, x0+j*bar, y(want)-1, x0+(j+1)*bar, y(want)+2, red)
			}
		}
		text(img, x0-6, y(0)+10, strings.ReplaceAll(p.Test, "_", " "), black, 2)
		text(img, x0-6, y(0)+26, sizeName(p.Size), black, 2)
	}
	note := "RED MARK: ISSUE 18 TARGET. "
	if slices.Contains(slots, "stream") {
		note = "RED MARK: ISSUE 18 TARGET (STREAM: 0.9X ASYNC BW, 1.2X ASYNC LAT). "
	}
	text(img, left, H-22, note+"SOFT-ROCE UNDER QEMU TCG: RATIOS ONLY, NOT HARDWARE SPEED", black, 2)
	return img
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	for y := max(y0, 0); y < y1 && y < img.Rect.Dy(); y++ {
		for x := max(x0, 0); x < x1 && x < img.Rect.Dx(); x++ {
			img.SetRGBA(x, y, c)
		}
	}
}

func frame(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	fill(img, x0, y0, x1+1, y0+1, c)
	fill(img, x0, y1, x1+1, y1+1, c)
	fill(img, x0, y0, x0+1, y1+1, c)
	fill(img, x1, y0, x1+1, y1+1, c)
}

// line draws a line w pixels wide; dash alternates on and off lengths.
func line(img *image.RGBA, x0, y0, x1, y1 float64, w int, c color.RGBA, dash []float64) {
	n := math.Hypot(x1-x0, y1-y0)
	period := 0.0
	for _, d := range dash {
		period += d
	}
	for s := 0.0; s <= n; s += 0.5 {
		if period > 0 {
			ph, on := math.Mod(s, period), false
			for i, d := range dash {
				if ph < d {
					on = i%2 == 0
					break
				}
				ph -= d
			}
			if !on {
				continue
			}
		}
		x, y := x0, y0
		if n > 0 {
			x, y = x0+(x1-x0)*s/n, y0+(y1-y0)*s/n
		}
		xi, yi := int(math.Round(x))-w/2, int(math.Round(y))-w/2
		fill(img, xi, yi, xi+w, yi+w, c)
	}
}

// marker draws a filled marker with a white rim.
func marker(img *image.RGBA, x, y, kind int, c color.RGBA) {
	shape := func(r int, c color.RGBA) {
		for dy := -r; dy <= r; dy++ {
			var half int
			switch kind {
			case markSquare:
				half = r - 1
				if dy == -r || dy == r {
					half = -1
				}
			case markDiamond:
				half = r - abs(dy)
			case markTriangle:
				half = (dy + r) * 2 / 3
			default:
				half = int(math.Sqrt(float64(r*r - dy*dy)))
			}
			if half >= 0 {
				fill(img, x-half, y+dy, x+half+1, y+dy+1, c)
			}
		}
	}
	shape(7, white)
	shape(5, c)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// font is a 3x5 pixel font: each glyph is five rows of three bits. text
// draws lower case as upper case.
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
	'_': {"000", "000", "000", "000", "111"}, '[': {"011", "010", "010", "010", "011"},
	']': {"110", "010", "010", "010", "110"}, 'µ': {"101", "101", "101", "111", "100"},
	'%': {"101", "001", "010", "100", "101"}, '+': {"000", "010", "111", "010", "000"},
}

func textWidth(s string, scale int) int {
	n := len([]rune(s))
	if n == 0 {
		return 0
	}
	return (4*n - 1) * scale
}

func text(img *image.RGBA, x, y int, s string, c color.RGBA, scale int) {
	for _, r := range s {
		if r != 'µ' {
			r = []rune(strings.ToUpper(string(r)))[0]
		}
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
