// Command rdmaperf is a perftest-style benchmark for go-rdma: the same
// tests, flags, columns and units as perftest's ib_*_bw and ib_*_lat, so
// that its figures can be put next to perftest's on the same device.
//
//	rdmaperf write_bw [flags]          # server
//	rdmaperf write_bw [flags] HOST     # client
//
// Tests: write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat.
// --api=verbs measures the raw provider (internal/verbs: post chains, poll
// many completions per call, selective signaling); --api=async measures
// the rdma.Conn future and batch API. The out-of-band exchange and the
// barriers between sizes use a TCP connection to -p (the async API's own
// handshake uses -p+1). See docs/performance.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
)

var tests = map[string]bool{
	"write_bw": true, "send_bw": true, "read_bw": true, "atomic_bw": true,
	"write_lat": true, "send_lat": true, "read_lat": true,
}

// params are the flags of one run, as perftest names them where it has
// them.
type params struct {
	test      string
	host      string // "" on the server
	size      int
	all       bool
	iters     int
	duration  time.Duration
	txDepth   int
	rxDepth   int
	postList  int
	cqMod     int
	device    string
	ibPort    int
	gidIndex  int
	port      int
	gbits     bool
	outJSON   string
	api       string
	provider  string
	pollMode  string
	locked    bool
	timeout   time.Duration
	setFlags  map[string]bool
	isLat     bool
	stdout    io.Writer
	connected func() // test hook: called once the server listens
}

// result is one line of the table.
type result struct {
	Test     string  `json:"test"`
	API      string  `json:"api"`
	Provider string  `json:"provider"`
	Device   string  `json:"device"`
	Bytes    int     `json:"bytes"`
	Iters    int     `json:"iterations"`
	Seconds  float64 `json:"seconds"`
	// bandwidth tests
	BWPeakGbps float64 `json:"bw_peak_gbps,omitempty"`
	BWAvgGbps  float64 `json:"bw_avg_gbps,omitempty"`
	BWPeakMiB  float64 `json:"bw_peak_mib,omitempty"`
	BWAvgMiB   float64 `json:"bw_avg_mib,omitempty"`
	MsgRate    float64 `json:"msg_rate_mpps,omitempty"`
	// latency tests, µs
	TMin     float64 `json:"t_min_us,omitempty"`
	TMax     float64 `json:"t_max_us,omitempty"`
	TTypical float64 `json:"t_typical_us,omitempty"`
	TAvg     float64 `json:"t_avg_us,omitempty"`
	TStdev   float64 `json:"t_stdev_us,omitempty"`
	T99      float64 `json:"t_99_us,omitempty"`
	T999     float64 `json:"t_99_9_us,omitempty"`
}

func main() {
	p, err := parseArgs(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "rdmaperf:", err)
		os.Exit(2)
	}
	p.stdout = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, p); err != nil {
		fmt.Fprintln(os.Stderr, "rdmaperf:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: rdmaperf TEST [flags] [HOST]   (server without HOST, client with it)")
	fmt.Fprintln(w, "tests: write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func parseArgs(args []string, errw io.Writer) (*params, error) {
	if len(args) == 0 || !tests[args[0]] {
		fs := flag.NewFlagSet("rdmaperf", flag.ContinueOnError)
		usage(errw, fs)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil, flag.ErrHelp
		}
		return nil, fmt.Errorf("want a test name first")
	}
	p := &params{test: args[0], isLat: strings.HasSuffix(args[0], "_lat")}
	fs := flag.NewFlagSet("rdmaperf "+p.test, flag.ContinueOnError)
	fs.SetOutput(errw)
	fs.IntVar(&p.size, "s", 65536, "message size in bytes (lat tests default 2)")
	fs.BoolVar(&p.all, "a", false, "run all sizes from 2 B to 8 MiB")
	fs.IntVar(&p.iters, "n", 0, "iterations per size (default 5000 bw, 1000 lat)")
	var dur int
	fs.IntVar(&dur, "D", 0, "run each size for this many seconds instead of -n")
	fs.IntVar(&p.txDepth, "t", 0, "tx depth: operations in flight (default 128 bw, 1 lat)")
	fs.IntVar(&p.rxDepth, "r", 512, "receives kept posted (send tests)")
	fs.IntVar(&p.postList, "l", 1, "post list: WRs per post call (verbs API; batch size for async)")
	fs.IntVar(&p.cqMod, "Q", 0, "CQ moderation: signal one WR in Q (default 100 bw, 1 lat; verbs API)")
	fs.StringVar(&p.device, "d", "", "device name (default: the first usable)")
	fs.IntVar(&p.ibPort, "i", 1, "device port")
	fs.IntVar(&p.gidIndex, "x", -1, "GID index (default: the first RoCE v2 IPv4 GID)")
	fs.IntVar(&p.port, "p", 18515, "TCP port of the out-of-band exchange (async API: also -p+1)")
	fs.BoolVar(&p.gbits, "report_gbits", false, "report bandwidth in Gb/s (10^9 bit/s) instead of MiB/s")
	fs.StringVar(&p.outJSON, "out_json", "", "also write the results as JSON to this file")
	fs.StringVar(&p.api, "api", "verbs", "verbs (raw provider) or async (rdma.Conn futures and batches)")
	fs.StringVar(&p.provider, "provider", "auto", "soft, verbs or auto")
	fs.StringVar(&p.pollMode, "poll", "busy", "async API poll mode: busy, adaptive or event")
	fs.BoolVar(&p.locked, "poller_lock", true, "async API: pollers locked to OS threads (rdma.WithPollerThreadLock)")
	fs.DurationVar(&p.timeout, "timeout", 2*time.Minute, "give up when the peer does not answer for this long")
	fs.Usage = func() { usage(errw, fs) }
	rest := args[1:]
	if err := fs.Parse(rest); err != nil {
		return nil, err
	}
	// perftest puts the host last, but accept it anywhere.
	if fs.NArg() > 0 {
		p.host = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return nil, err
		}
		if fs.NArg() > 0 {
			return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
	}
	p.setFlags = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { p.setFlags[f.Name] = true })
	p.duration = time.Duration(dur) * time.Second
	if p.isLat && !p.setFlags["s"] {
		p.size = 2
	}
	if p.test == "atomic_bw" {
		p.size = 8
	}
	if p.iters == 0 {
		p.iters = 5000
		if p.isLat {
			p.iters = 1000
		}
	}
	if p.txDepth == 0 {
		p.txDepth = 128
		if p.isLat {
			p.txDepth = 1
		}
	}
	if p.cqMod == 0 {
		p.cqMod = 100
		if p.isLat {
			p.cqMod = 1
		}
	}
	switch {
	case p.size < 1 || p.size > 1<<30:
		return nil, fmt.Errorf("-s %d: want 1 B..1 GiB", p.size)
	case p.iters < 1:
		return nil, fmt.Errorf("-n %d: want at least 1", p.iters)
	case dur < 0:
		return nil, fmt.Errorf("-D %d: want seconds >= 0", dur)
	case p.txDepth < 1 || p.txDepth > 8192:
		return nil, fmt.Errorf("-t %d: want 1..8192", p.txDepth)
	case p.rxDepth < 1 || p.rxDepth > 8192:
		return nil, fmt.Errorf("-r %d: want 1..8192", p.rxDepth)
	case p.postList < 1:
		return nil, fmt.Errorf("-l %d: want at least 1", p.postList)
	case p.cqMod < 1:
		return nil, fmt.Errorf("-Q %d: want at least 1", p.cqMod)
	case p.api != "verbs" && p.api != "async":
		return nil, fmt.Errorf("--api %q: want verbs or async", p.api)
	case p.provider != "auto" && p.provider != "soft" && p.provider != "verbs":
		return nil, fmt.Errorf("--provider %q: want soft, verbs or auto", p.provider)
	case p.pollMode != "busy" && p.pollMode != "adaptive" && p.pollMode != "event":
		return nil, fmt.Errorf("--poll %q: want busy, adaptive or event", p.pollMode)
	case p.port < 1 || p.port > 65534:
		return nil, fmt.Errorf("-p %d: want 1..65534", p.port)
	}
	if p.isLat && p.txDepth != 1 {
		return nil, fmt.Errorf("-t %d: latency tests keep one operation in flight", p.txDepth)
	}
	if p.test == "atomic_bw" && p.all {
		return nil, fmt.Errorf("-a: atomic_bw has one size, 8 B")
	}
	// The post list and the signaling period must fit the tx depth, and
	// a signaled WR must be in flight whenever the window is full.
	p.postList = min(p.postList, p.txDepth)
	p.cqMod = max(1, min(p.cqMod, p.txDepth-p.postList+1))
	return p, nil
}

// sizes are the message sizes of the run: -s, or 2 B..8 MiB with -a.
func (p *params) sizes() []int {
	if !p.all {
		return []int{p.size}
	}
	var s []int
	for n := 2; n <= 8<<20; n *= 2 {
		s = append(s, n)
	}
	return s
}

func (p *params) maxSize() int {
	s := p.sizes()
	return s[len(s)-1]
}

func run(ctx context.Context, p *params) error {
	var results []result
	var err error
	if p.api == "verbs" {
		results, err = runRaw(ctx, p)
	} else {
		results, err = runAsync(ctx, p)
	}
	if err != nil {
		return err
	}
	if p.outJSON != "" {
		b, err := json.MarshalIndent(map[string]any{"test": p.test, "api": p.api, "results": results}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(p.outJSON, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
