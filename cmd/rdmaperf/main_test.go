package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestMain runs main() itself when the test binary is started as
// rdmaperf (TestExitCodes).
func TestMain(m *testing.M) {
	if os.Getenv("RDMAPERF_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// freePort returns a port p such that p and p+1 were free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 50; i++ {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		a.Close()
		if err == nil {
			b.Close()
			if p < 65534 {
				return p
			}
		}
	}
	t.Fatal("no two adjacent free ports")
	return 0
}

// checkJSON checks that every figure of the JSON file is positive.
func checkJSON(t *testing.T, file string, p *params, rows int) []result {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != rows {
		t.Fatalf("JSON has %d results, the table %d", len(doc.Results), rows)
	}
	for _, r := range doc.Results {
		figs := []float64{r.Seconds, r.BWPeakGbps, r.BWAvgGbps, r.BWPeakMiB, r.BWAvgMiB, r.MsgRate}
		if p.isLat {
			figs = []float64{r.TMin, r.TMax, r.TTypical, r.TAvg, r.T99, r.T999}
		}
		for i, v := range figs {
			if !(v > 0) {
				t.Errorf("JSON result %+v: figure %d is %v", r, i, v)
			}
		}
		if r.Test != p.test || r.API != p.api || r.Provider != "soft" || r.Iters < 1 {
			t.Errorf("JSON result %+v", r)
		}
	}
	return doc.Results
}

// pairResult is what both sides of a run printed and returned.
type pairResult struct {
	cout, sout string // stdout
	cerr, serr string // stderr (the progress line)
	cp, sp     *params
	cErr, sErr error
}

// runPair runs the server and the client of one test in two goroutines on
// the soft provider; setup, if not nil, adjusts both sides' parameters
// first. Errors are returned, not fatal.
func runPair(t *testing.T, setup func(sp, cp *params), args ...string) pairResult {
	t.Helper()
	port := fmt.Sprint(freePort(t))
	base := append([]string{"--provider", "soft", "-p", port, "--timeout", "60s"}, args[1:]...)
	sp, err := parseArgs(append([]string{args[0]}, base...), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := parseArgs(append(append([]string{args[0]}, base...), "127.0.0.1"), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	sp.outJSON = "" // the client's file
	var sout, cout, serr, cerr bytes.Buffer
	sp.stdout, cp.stdout = &sout, &cout
	sp.stderr, cp.stderr = &serr, &cerr
	if setup != nil {
		setup(sp, cp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	listening := make(chan struct{})
	sp.connected = func() { close(listening) }
	sdone := make(chan error, 1)
	go func() { sdone <- run(ctx, sp) }()
	r := pairResult{cp: cp, sp: sp}
	select {
	case <-listening:
	case r.sErr = <-sdone:
		t.Fatalf("server: %v", r.sErr)
	}
	r.cErr = run(ctx, cp)
	if r.cErr != nil {
		cancel()
	}
	r.sErr = <-sdone
	r.cout, r.sout, r.cerr, r.serr = cout.String(), sout.String(), cerr.String(), serr.String()
	return r
}

// pair runs a test that must pass and returns the client's output.
func pair(t *testing.T, args ...string) (string, *params) {
	t.Helper()
	r := pairWith(t, nil, args...)
	return r.cout, r.cp
}

// pairWith runs a test that must pass.
func pairWith(t *testing.T, setup func(sp, cp *params), args ...string) pairResult {
	t.Helper()
	r := runPair(t, setup, args...)
	// freePort's ports are free when it looks; another package's test,
	// running at the same time, may take the second (the async API's
	// listener) before the server does. Then try other ports.
	for try := 0; try < 3 && errors.Is(r.sErr, syscall.EADDRINUSE); try++ {
		r = runPair(t, setup, args...)
	}
	if r.cErr != nil {
		t.Fatalf("client: %v\nserver: %v, said:\n%s", r.cErr, r.sErr, r.sout)
	}
	if r.sErr != nil {
		t.Fatalf("server: %v\nclient said:\n%s", r.sErr, r.cout)
	}
	return r
}

// checkRows checks that the table has one row per size with the right
// number of columns and positive figures.
func checkRows(t *testing.T, out string, p *params) [][]float64 {
	t.Helper()
	rows := parseTable(out)
	sizes := p.sizes()
	if len(rows) != len(sizes) {
		t.Fatalf("%d rows, want %d:\n%s", len(rows), len(sizes), out)
	}
	cols := 5
	if p.isLat {
		cols = 9
	}
	for i, r := range rows {
		if len(r) != cols {
			t.Fatalf("row %v has %d columns, want %d:\n%s", r, len(r), cols, out)
		}
		if int(r[0]) != sizes[i] {
			t.Errorf("row %d: %v bytes, want %d", i, r[0], sizes[i])
		}
		want := p.iters
		if !p.isLat {
			want *= p.qps // perftest counts every QP's iterations
		}
		if p.duration == 0 && int(r[1]) != want {
			t.Errorf("row %d: %v iterations, want %d", i, r[1], want)
		}
		for j, v := range r {
			if !p.isLat && (j == 2 || j == 3) {
				// two decimals of a slow run's MiB/s can round to 0;
				// checkJSON checks the figures themselves
				if !(v >= 0) {
					t.Errorf("row %d column %d is %v", i, j, v)
				}
				continue
			}
			if !(v > 0) {
				t.Errorf("row %d column %d is %v, want > 0:\n%s", i, j, v, out)
			}
		}
		if p.isLat && !(r[2] <= r[4] && r[4] <= r[3] && r[7] <= r[8]) {
			t.Errorf("row %d: want t_min <= t_typical <= t_max and p99 <= p99.9: %v", i, r)
		} else if !p.isLat && r[2] < r[3]*0.999 {
			t.Errorf("row %d: peak %v below average %v", i, r[2], r[3])
		}
	}
	return rows
}

func TestEveryTest(t *testing.T) {
	for _, api := range []string{"verbs", "async"} {
		for _, name := range []string{"write_bw", "send_bw", "read_bw", "atomic_bw", "write_lat", "send_lat", "read_lat"} {
			t.Run(api+"/"+name, func(t *testing.T) {
				args := []string{name, "--api", api, "-n", "40", "--report_gbits"}
				if !strings.HasSuffix(name, "_lat") && name != "atomic_bw" {
					args = append(args, "-s", "4096", "-t", "16", "-Q", "4")
				}
				js := filepath.Join(t.TempDir(), "out.json")
				out, p := pair(t, append(args, "--out_json", js)...)
				rows := checkRows(t, out, p)
				checkJSON(t, js, p, len(rows))
				if !strings.Contains(out, "Gb/sec") && !p.isLat {
					t.Errorf("--report_gbits: no Gb/sec column:\n%s", out)
				}
			})
		}
	}
}

// TestAllSizesJSON runs -a (receives posted for a small size must take a
// larger one), a post list, and checks the JSON file.
func TestAllSizesJSON(t *testing.T) {
	for _, api := range []string{"verbs", "async"} {
		t.Run(api, func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "out.json")
			out, p := pair(t, "send_bw", "--api", api, "-a", "-n", "8", "-t", "8", "-l", "4", "-Q", "2", "-r", "16", "--out_json", js)
			rows := checkRows(t, out, p)
			res := checkJSON(t, js, p, len(rows))
			if last := res[len(res)-1]; last.Bytes != 8<<20 {
				t.Errorf("last result %+v, want 8 MiB", last)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	bad := [][]string{
		{}, {"nosuch_bw"}, {"write_bw", "-s", "0"}, {"write_bw", "--api", "stream2"},
		{"write_lat", "-t", "4"}, {"write_bw", "--provider", "x"}, {"atomic_bw", "-a"},
		{"write_bw", "h1", "h2"}, {"send_bw", "--poller_lock=maybe"}, {"send_lat", "-Q", "18"},
	}
	for _, a := range bad {
		if _, err := parseArgs(a, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", a)
		}
	}
	p, err := parseArgs([]string{"write_bw", "10.0.0.1", "-s", "8", "-t", "8", "-l", "8", "-Q", "100"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if p.host != "10.0.0.1" || p.size != 8 || p.postList != 8 || p.cqMod != 1 {
		t.Errorf("got host %q size %d -l %d -Q %d", p.host, p.size, p.postList, p.cqMod)
	}
	p, _ = parseArgs([]string{"send_lat"}, &bytes.Buffer{})
	if p.size != 2 || p.txDepth != 1 || p.iters != 1000 || p.host != "" {
		t.Errorf("send_lat defaults: %+v", p)
	}
	for arg, want := range map[string]string{"": "auto", "--poller_lock": "true", "--poller_lock=false": "false", "--poller_lock=auto": "auto"} {
		args := []string{"send_bw"}
		if arg != "" {
			args = append(args, arg)
		}
		wantOpts := 1 // rdma.WithPollerThreadLock
		if want == "auto" {
			wantOpts = 0
		}
		p, err := parseArgs(args, &bytes.Buffer{})
		if err != nil || p.locked.String() != want || len(p.locked.options()) != wantOpts {
			t.Errorf("%q: poller_lock %v (err %v), want %s", args, p.locked.String(), err, want)
		}
	}
	if n := len((&params{all: true}).sizes()); n != 23 {
		t.Errorf("-a gives %d sizes, want 23 (2 B..8 MiB)", n)
	}
}

func TestLatStats(t *testing.T) {
	s := make([]float64, 1000)
	for i := range s {
		s[i] = float64((i + 1) * 1000) // 1..1000 µs
	}
	r := latResult(&params{}, 8, s)
	if r.TMin != 1 || r.TMax != 1000 || r.TTypical != 501 || r.T99 != 990 || r.T999 != 999 || r.TAvg != 500.5 {
		t.Errorf("%+v", r)
	}
}

func TestCycles(t *testing.T) {
	ns := cycleNS()
	if !(ns > 0.01 && ns < 100) {
		t.Fatalf("one cycle is %v ns", ns)
	}
	c0, t0 := cycles(), time.Now()
	for time.Since(t0) < 5*time.Millisecond {
	}
	el := float64(cycles()-c0) * ns
	if want := float64(time.Since(t0).Nanoseconds()); el < want*0.5 || el > want*1.5 {
		t.Errorf("cycles say %v ns, the clock %v ns", el, want)
	}
}

// countQP counts the send WRs posted on a QP and those with the inline
// flag; grant, when >= 0, replaces the inline size the QP reports.
type countQP struct {
	verbs.QP
	posted, inline atomic.Int64
	grant          int
}

func (q *countQP) PostSend(wrs []verbs.SendWR) (int, error) {
	for _, w := range wrs {
		q.posted.Add(1)
		if w.Flags&verbs.SendInline != 0 {
			q.inline.Add(1)
		}
	}
	return q.QP.PostSend(wrs)
}

func (q *countQP) Cap() verbs.QPCap {
	c := q.QP.Cap()
	if q.grant >= 0 {
		c.MaxInlineData = q.grant
	}
	return c
}

// qpCounter wraps the QPs one side creates.
type qpCounter struct {
	mu    sync.Mutex
	qps   []*countQP
	grant int
}

func (c *qpCounter) wrap(qp verbs.QP) verbs.QP {
	q := &countQP{QP: qp, grant: c.grant}
	c.mu.Lock()
	c.qps = append(c.qps, q)
	c.mu.Unlock()
	return q
}

// totals are the posted and inline WRs of each QP.
func (c *qpCounter) totals() (posted, inline []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.qps {
		posted = append(posted, q.posted.Load())
		inline = append(inline, q.inline.Load())
	}
	return posted, inline
}

// counted runs a verbs-API pair with both sides' QPs counted.
func counted(t *testing.T, grant int, args ...string) (pairResult, *qpCounter, *qpCounter) {
	t.Helper()
	sc, cc := &qpCounter{grant: grant}, &qpCounter{grant: grant}
	r := runPair(t, func(sp, cp *params) { sp.wrapQP, cp.wrapQP = sc.wrap, cc.wrap }, args...)
	return r, sc, cc
}

func readJSON(t *testing.T, file string) []result {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Results
}

func TestInline(t *testing.T) {
	t.Run("write_bw", func(t *testing.T) {
		r, _, cc := counted(t, -1, "write_bw", "-I", "256", "-s", "64", "-n", "40", "-t", "16", "-Q", "4")
		if r.cErr != nil || r.sErr != nil {
			t.Fatalf("client: %v, server: %v", r.cErr, r.sErr)
		}
		checkRows(t, r.cout, r.cp)
		posted, inline := cc.totals()
		if len(posted) != 1 || posted[0] != 40 || inline[0] != 40 {
			t.Errorf("client QPs posted %v WRs, %v of them inline; want 40 and 40", posted, inline)
		}
		if !strings.Contains(r.cout, "Max inline data: 256[B]") {
			t.Errorf("no inline size in the header:\n%s", r.cout)
		}
	})
	t.Run("send_lat", func(t *testing.T) {
		r, sc, cc := counted(t, -1, "send_lat", "-I", "64", "-s", "8", "-n", "30")
		if r.cErr != nil || r.sErr != nil {
			t.Fatalf("client: %v, server: %v", r.cErr, r.sErr)
		}
		checkRows(t, r.cout, r.cp)
		for side, c := range map[string]*qpCounter{"server": sc, "client": cc} {
			if posted, inline := c.totals(); len(posted) != 1 || posted[0] != 30 || inline[0] != 30 {
				t.Errorf("%s posted %v sends, %v inline; want 30 and 30", side, posted, inline)
			}
		}
	})
	t.Run("larger than -I", func(t *testing.T) {
		r, _, cc := counted(t, -1, "send_bw", "-I", "256", "-s", "512", "-n", "20", "-t", "8", "-Q", "4", "-r", "16")
		if r.cErr != nil || r.sErr != nil {
			t.Fatalf("client: %v, server: %v", r.cErr, r.sErr)
		}
		if posted, inline := cc.totals(); posted[0] != 20 || inline[0] != 0 {
			t.Errorf("512 B messages with -I 256: %v posted, %v inline; want 20 and 0", posted, inline)
		}
	})
	t.Run("beyond the device", func(t *testing.T) {
		// soft refuses QPs of more than 1 KiB of inline data
		r := runPair(t, nil, "write_bw", "-I", "4096", "-s", "64", "-n", "10")
		if r.cErr == nil || !strings.Contains(r.cErr.Error(), "-I 4096") {
			t.Errorf("client error %v, want one that names -I 4096", r.cErr)
		}
		if r.sErr == nil {
			t.Errorf("the server ran on")
		}
	})
	t.Run("granted less", func(t *testing.T) {
		r, _, _ := counted(t, 16, "write_bw", "-I", "128", "-s", "64", "-n", "10")
		if r.cErr == nil || !strings.Contains(r.cErr.Error(), "grants only 16 bytes") {
			t.Errorf("client error %v, want the granted 16 bytes", r.cErr)
		}
	})
}

// gateCh tells when its side first waits for a completion event.
type gateCh struct {
	verbs.CompChannel
	waiting chan struct{}
	once    sync.Once
}

func (g *gateCh) GetEvent(ctx context.Context) (verbs.CQ, error) {
	g.once.Do(func() { close(g.waiting) })
	return g.CompChannel.GetEvent(ctx)
}

// gateQP holds its side's first send until the peer waits for an event,
// so that the peer must take one (bounded, in case it never waits).
type gateQP struct {
	verbs.QP
	peer *gateCh
	once sync.Once
}

func (g *gateQP) PostSend(wrs []verbs.SendWR) (int, error) {
	g.once.Do(func() {
		select {
		case <-g.peer.waiting:
		case <-time.After(30 * time.Second):
		}
	})
	return g.QP.PostSend(wrs)
}

func TestEvents(t *testing.T) {
	for _, name := range []string{"send_bw", "write_bw", "read_bw", "atomic_bw", "send_lat", "read_lat"} {
		t.Run("verbs/"+name, func(t *testing.T) {
			args := []string{name, "-e", "-n", "40"}
			if !strings.HasSuffix(name, "_lat") && name != "atomic_bw" {
				args = append(args, "-s", "4096", "-t", "16", "-Q", "4", "-r", "32")
			}
			cjs, sjs := filepath.Join(t.TempDir(), "c.json"), filepath.Join(t.TempDir(), "s.json")
			sch, cch := &gateCh{waiting: make(chan struct{})}, &gateCh{waiting: make(chan struct{})}
			r := pairWith(t, func(sp, cp *params) {
				sp.outJSON = sjs
				sp.wrapChannel = func(ch verbs.CompChannel) verbs.CompChannel { sch.CompChannel = ch; return sch }
				cp.wrapChannel = func(ch verbs.CompChannel) verbs.CompChannel { cch.CompChannel = ch; return cch }
				if strings.HasPrefix(name, "send") {
					sp.wrapQP = func(qp verbs.QP) verbs.QP { return &gateQP{QP: qp, peer: cch} }
					cp.wrapQP = func(qp verbs.QP) verbs.QP { return &gateQP{QP: qp, peer: sch} }
				}
			}, append(args, "--out_json", cjs)...)
			checkRows(t, r.cout, r.cp)
			if !strings.Contains(r.cout, "events (completion channel)") {
				t.Errorf("header does not say events:\n%s", r.cout)
			}
			// The gates make the receiver of the first SEND wait for
			// it on the channel. (One-sided operations on soft may be
			// complete whenever they are polled.)
			res := readJSON(t, cjs)
			switch name {
			case "send_lat":
				if res[0].Events < 1 {
					t.Errorf("the client took %d completion events", res[0].Events)
				}
			case "send_bw":
				if sres := readJSON(t, sjs); sres[0].Events < 1 {
					t.Errorf("the server took %d completion events", sres[0].Events)
				}
			}
		})
	}
	t.Run("async", func(t *testing.T) {
		r := pairWith(t, nil, "send_lat", "--api", "async", "-e", "-n", "30")
		checkRows(t, r.cout, r.cp)
		if r.cp.pollMode != "event" || !strings.Contains(r.cout, "Polling        : event") {
			t.Errorf("-e gave poll mode %q:\n%s", r.cp.pollMode, r.cout)
		}
	})
}

func TestQPs(t *testing.T) {
	t.Run("verbs/write_bw", func(t *testing.T) {
		js := filepath.Join(t.TempDir(), "out.json")
		r, sc, cc := counted(t, -1, "write_bw", "-q", "4", "-n", "40", "-s", "4096", "-t", "8", "-Q", "4", "--out_json", js)
		if r.cErr != nil || r.sErr != nil {
			t.Fatalf("client: %v, server: %v", r.cErr, r.sErr)
		}
		checkRows(t, r.cout, r.cp) // 4 × 40 iterations
		posted, _ := cc.totals()
		if fmt.Sprint(posted) != "[40 40 40 40]" {
			t.Errorf("the client's QPs posted %v WRs, want 40 on each of 4", posted)
		}
		if sp, _ := sc.totals(); len(sp) != 4 {
			t.Errorf("the server made %d QPs", len(sp))
		}
		res := readJSON(t, js)
		if res[0].QPs != 4 || fmt.Sprint(res[0].PerQP) != "[40 40 40 40]" || res[0].Iters != 160 {
			t.Errorf("JSON %+v", res[0])
		}
	})
	t.Run("verbs/send_bw", func(t *testing.T) {
		r := pairWith(t, nil, "send_bw", "-q", "3", "-n", "30", "-s", "1024", "-t", "8", "-Q", "4", "-r", "16", "-l", "2")
		checkRows(t, r.cout, r.cp)
		if rows := parseTable(r.sout); len(rows) != 1 || rows[0][1] != 90 {
			t.Errorf("the server received %v, want 90 messages:\n%s", rows, r.sout)
		}
	})
	for _, name := range []string{"write_bw", "send_bw"} {
		t.Run("async/"+name, func(t *testing.T) {
			// -l 4 does not divide -n 10: each connection still does 10
			js := filepath.Join(t.TempDir(), "out.json")
			r := pairWith(t, nil, name, "--api", "async", "-q", "4", "-n", "10", "-s", "4096", "-t", "8", "-l", "4", "--out_json", js)
			checkRows(t, r.cout, r.cp)
			if !strings.Contains(r.cout, "Number of qps  : 4") {
				t.Errorf("header:\n%s", r.cout)
			}
			res := readJSON(t, js)
			if res[0].QPs != 4 || fmt.Sprint(res[0].PerQP) != "[10 10 10 10]" {
				t.Errorf("JSON %+v, want 10 operations on each of 4 connections", res[0])
			}
			if name == "send_bw" {
				if rows := parseTable(r.sout); len(rows) != 1 || rows[0][1] != 40 {
					t.Errorf("the server received %v, want 40 messages:\n%s", rows, r.sout)
				}
			}
		})
	}
}

// TestPosters runs the async API's bandwidth tests with -g: goroutines
// posting Futures at once, over two connections. Every operation is
// counted once, and a SEND reaches the server once.
func TestPosters(t *testing.T) {
	for _, name := range []string{"write_bw", "send_bw", "read_bw"} {
		t.Run(name, func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "out.json")
			r := pairWith(t, nil, name, "--api", "async", "-g", "4", "-q", "2", "-n", "25", "-s", "64", "-t", "8", "--out_json", js)
			checkRows(t, r.cout, r.cp) // 2 × 25 operations
			res := readJSON(t, js)
			require.Len(t, res, 1)
			assert.Equal(t, 50, res[0].Iters)
			if name == "send_bw" {
				rows := parseTable(r.sout)
				require.Len(t, rows, 1, r.sout)
				assert.Equal(t, 50.0, rows[0][1], "messages the server received")
			}
		})
	}
}

func TestStream(t *testing.T) {
	for _, size := range []int{4096, 100000} {
		t.Run(fmt.Sprintf("send_bw/%d", size), func(t *testing.T) {
			cjs, sjs := filepath.Join(t.TempDir(), "c.json"), filepath.Join(t.TempDir(), "s.json")
			r := pairWith(t, func(sp, cp *params) { sp.outJSON = sjs },
				"send_bw", "--api", "stream", "-s", fmt.Sprint(size), "-n", "50", "--report_gbits", "--out_json", cjs)
			checkRows(t, r.cout, r.cp)
			checkRows(t, r.sout, r.sp)
			want := int64(50 * size)
			for side, file := range map[string]string{"client": cjs, "server": sjs} {
				res := readJSON(t, file)
				if len(res) != 1 || res[0].StreamBytes != want || !(res[0].BWAvgGbps > 0) || res[0].API != "stream" {
					t.Errorf("%s: %+v, want %d bytes and a bandwidth", side, res, want)
				}
			}
		})
	}
	t.Run("send_lat", func(t *testing.T) {
		js := filepath.Join(t.TempDir(), "out.json")
		out, p := pair(t, "send_lat", "--api", "stream", "-s", "8", "-n", "50", "--out_json", js)
		rows := checkRows(t, out, p)
		checkJSON(t, js, p, len(rows))
	})
	t.Run("events", func(t *testing.T) {
		r := pairWith(t, nil, "send_lat", "--api", "stream", "-e", "-n", "20", "--poller_lock=false")
		checkRows(t, r.cout, r.cp)
		if !strings.Contains(r.cout, "Polling        : event") {
			t.Errorf("header:\n%s", r.cout)
		}
	})
}

var progressRE = regexp.MustCompile(`^rdmaperf: (\w+) (\d+) B: (\d+) iters, (t_avg )?[0-9.]+ (Gb/s|MiB/s|usec), [0-9.]+ s$`)

// progressLines checks every line of a side's stderr and counts them.
func progressLines(t *testing.T, out, test string, size int) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		m := progressRE.FindStringSubmatch(l)
		if m == nil || m[1] != test || m[2] != fmt.Sprint(size) {
			t.Errorf("progress line %q", l)
			continue
		}
		n++
	}
	return n
}

func TestDuration(t *testing.T) {
	for _, c := range []struct{ name, api, q string }{
		{"write_bw", "verbs", "1"}, {"send_lat", "verbs", "1"}, {"send_bw", "async", "2"}, {"send_bw", "stream", "1"},
	} {
		t.Run(c.api+"/"+c.name, func(t *testing.T) {
			start := time.Now()
			r := pairWith(t, func(sp, cp *params) { cp.progressEvery = 200 * time.Millisecond },
				c.name, "--api", c.api, "-q", c.q, "-D", "1", "-s", "64", "--report_gbits")
			rows := checkRows(t, r.cout, r.cp)
			if el := time.Since(start); el < time.Second || el > 30*time.Second {
				t.Errorf("-D 1 took %v", el)
			}
			if rows[0][1] < 2 {
				t.Errorf("only %v iterations in a second", rows[0][1])
			}
			// -D shows the line from the start, every 200 ms here
			if n := progressLines(t, r.cerr, c.name, 64); n < 2 {
				t.Errorf("%d progress lines in a second:\n%s", n, r.cerr)
			}
		})
	}
}

func TestProgress(t *testing.T) {
	fast := func(sp, cp *params) {
		for _, p := range []*params{sp, cp} {
			p.progressAfter, p.progressEvery = 0, 0 // a line per check
		}
	}
	for _, name := range []string{"write_bw", "send_bw", "read_lat"} {
		t.Run(name, func(t *testing.T) {
			r := pairWith(t, fast, name, "-s", "64", "-n", "40")
			if n := progressLines(t, r.cerr, name, 64); n < 1 {
				t.Errorf("no progress line once the size has run its time:\n%q", r.cerr)
			}
			if name == "send_bw" {
				if n := progressLines(t, r.serr, name, 64); n < 1 {
					t.Errorf("the receiver shows no progress:\n%q", r.serr)
				}
			}
			r = pairWith(t, fast, name, "-s", "64", "-n", "40", "--no_progress")
			if r.cerr != "" || r.serr != "" {
				t.Errorf("--no_progress printed %q and %q", r.cerr, r.serr)
			}
		})
	}
	t.Run("short", func(t *testing.T) {
		r := pairWith(t, nil, "write_bw", "-s", "64", "-n", "40")
		if r.cerr != "" {
			t.Errorf("a short run printed %q", r.cerr)
		}
	})
	t.Run("terminal", func(t *testing.T) {
		var b bytes.Buffer
		p := &params{test: "write_bw", progress: true, stderr: &b, tty: true, gbits: true, progressEvery: time.Second, qps: 1}
		l := newProgressLine(p, 65536)
		l.begin(time.Now().Add(-3 * time.Second))
		l.show(time.Now(), 12345, 0)
		l.show(time.Now(), 22345, 0)
		l.end()
		got := b.String()
		re := regexp.MustCompile(`^(\rrdmaperf: write_bw 65536 B: \d+ iters, [0-9.]+ Gb/s, 3\.0 s\x1b\[K){2}\r\x1b\[K$`)
		if !re.MatchString(got) {
			t.Errorf("terminal output %q", got)
		}
	})
}

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"write_lat", "-q", "2"}, "latency tests run on one QP"},
		{[]string{"read_bw", "-I", "64"}, "SEND and WRITE only"},
		{[]string{"write_bw", "--api", "async", "-I", "64"}, "async API has no inline option"},
		{[]string{"write_bw", "--api", "stream"}, "send_bw and send_lat only"},
		{[]string{"send_bw", "--api", "stream", "-t", "4"}, "-t does not apply to --api=stream"},
		{[]string{"send_bw", "--api", "stream", "-q", "2"}, "one stream"},
		{[]string{"send_bw", "--api", "async", "-e", "--poll", "busy"}, "-e asks for the event poll mode"},
		{[]string{"write_lat", "-e"}, "spinning on memory"},
		{[]string{"write_bw", "-q", "0"}, "-q 0"},
		{[]string{"write_bw", "-g", "2"}, "async API's bandwidth tests"},
		{[]string{"write_lat", "--api", "async", "-g", "2"}, "async API's bandwidth tests"},
		{[]string{"write_bw", "--api", "async", "-g", "2", "-l", "4"}, "asks for Batches"},
		{[]string{"write_bw", "--api", "async", "-g", "0"}, "-g 0"},
		{[]string{"write_bw", "-I", "-1"}, "-I -1"},
	} {
		cmd := exec.Command(os.Args[0], c.args...)
		cmd.Env = append(os.Environ(), "RDMAPERF_TEST_MAIN=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit code 2", c.args, err)
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q said %q, want %q", c.args, stderr.String(), c.want)
		}
	}
}

// TestFloor: --floor measures a call into the provider and an empty poll
// inside one, with no peer, and prints both.
func TestFloor(t *testing.T) {
	p, err := parseArgs([]string{"send_lat", "--floor", "--provider", "soft"}, os.Stderr)
	require.NoError(t, err)
	var out bytes.Buffer
	p.stdout = &out
	require.NoError(t, run(context.Background(), p))
	m := regexp.MustCompile(`^floor: soft soft0: a call into the provider ([0-9.]+) usec, an empty poll inside one ([0-9.]+) usec\n$`).FindStringSubmatch(out.String())
	require.NotNil(t, m, "output %q", out.String())
}
