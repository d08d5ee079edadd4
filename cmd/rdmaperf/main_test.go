package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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

// pair runs the server and the client of one test in two goroutines on
// the soft provider and returns the client's output.
func pair(t *testing.T, args ...string) (string, *params) {
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
	var sout, cout bytes.Buffer
	sp.stdout, cp.stdout = &sout, &cout
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	listening := make(chan struct{})
	sp.connected = func() { close(listening) }
	serr := make(chan error, 1)
	go func() { serr <- run(ctx, sp) }()
	select {
	case <-listening:
	case err := <-serr:
		t.Fatalf("server: %v", err)
	}
	if err := run(ctx, cp); err != nil {
		cancel()
		<-serr
		t.Fatalf("client: %v\nserver said:\n%s", err, sout.String())
	}
	if err := <-serr; err != nil {
		t.Fatalf("server: %v\nclient said:\n%s", err, cout.String())
	}
	return cout.String(), cp
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
		if p.duration == 0 && int(r[1]) != p.iters {
			t.Errorf("row %d: %v iterations, want %d", i, r[1], p.iters)
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

func TestDuration(t *testing.T) {
	for _, name := range []string{"write_bw", "send_lat"} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			out, p := pair(t, name, "-D", "1", "-s", "64")
			rows := checkRows(t, out, p)
			if el := time.Since(start); el < time.Second || el > 30*time.Second {
				t.Errorf("-D 1 took %v", el)
			}
			if rows[0][1] < 2 {
				t.Errorf("only %v iterations in a second", rows[0][1])
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	bad := [][]string{
		{}, {"nosuch_bw"}, {"write_bw", "-s", "0"}, {"write_bw", "--api", "stream2"},
		{"write_lat", "-t", "4"}, {"write_bw", "--provider", "x"}, {"atomic_bw", "-a"},
		{"write_bw", "h1", "h2"},
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
