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
// the rdma.Conn future and batch API; --api=stream measures the net.Conn
// stream (send_bw and send_lat only). -c UD (--connection, --transport)
// runs send_bw and send_lat over unreliable datagrams, as perftest's -c
// UD: the verbs API on raw UD QPs, the async API on an rdma.PacketConn.
// The out-of-band exchange and the
// barriers between sizes use a TCP connection to -p (the async API's and
// the stream's own handshake use -p+1). See docs/performance.md.
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
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

var tests = map[string]bool{
	"write_bw": true, "send_bw": true, "read_bw": true, "atomic_bw": true,
	"write_lat": true, "send_lat": true, "read_lat": true,
}

// params are the flags of one run, as perftest names them where it has
// them.
type params struct {
	test     string
	host     string // "" on the server
	size     int
	all      bool
	iters    int
	duration time.Duration
	txDepth  int
	rxDepth  int
	postList int
	cqMod    int
	device   string
	ibPort   int
	gidIndex int
	port     int
	gbits    bool
	outJSON  string
	api      string
	provider string
	pollMode string
	locked   lockFlag // --poller_lock: auto, true or false
	timeout  time.Duration
	inline   int    // -I: largest message sent inline (verbs API)
	events   bool   // -e: wait for completion events instead of polling
	qps      int    // -q: queue pairs (connections) of the bw tests
	posters  int    // -g: goroutines posting Futures (async API bw tests)
	floor    bool   // --floor: measure a call into the provider, print it, exit
	progress bool   // the progress line on stderr (--no_progress clears it)
	cpuProf  string // --cpuprofile: pprof CPU profile of the whole run
	trace    string // --trace: execution trace of the whole run
	stats    bool   // --stats: the pollers' and each async or stream connection's counters at the end, on stderr
	ud       bool   // -c UD: unreliable datagrams (send_bw, send_lat)
	udMTU    int    // -c UD: the path MTU, the largest size (set once both sides know it)
	setFlags map[string]bool
	isLat    bool
	stdout   io.Writer
	stderr   io.Writer // the progress line; nil: none
	tty      bool      // stderr is a terminal: overwrite the line with \r

	// test hooks
	connected     func()                                    // called once the server listens
	wrapQP        func(verbs.QP) verbs.QP                   // verbs API: wraps each QP created
	wrapChannel   func(verbs.CompChannel) verbs.CompChannel // verbs API, -e: wraps the completion channel
	progressAfter time.Duration                             // first progress line without -D (2 s)
	progressEvery time.Duration                             // progress line period (1 s)
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
	// -q > 1: the iterations of each QP (connection)
	QPs   int   `json:"qps,omitempty"`
	PerQP []int `json:"per_qp_iterations,omitempty"`
	// --api=stream send_bw: the bytes written (client) or read (server)
	StreamBytes int64 `json:"stream_bytes,omitempty"`
	// verbs API with -e: the completion events waited for
	Events int `json:"cq_events,omitempty"`
	// -c UD
	Transport string `json:"transport,omitempty"` // "UD"
	// send_bw's receiver: the datagrams the client sent, and those of
	// them that did not reach the benchmark (Sent - Iters); of these,
	// the async API's PacketConn counts those it dropped itself because
	// its queue for RecvFrom was full (PacketStats.DroppedQueueFull),
	// the rest found no receive posted or were lost on the way
	Sent      int `json:"ud_sent,omitempty"`
	Dropped   int `json:"ud_dropped,omitempty"`
	QueueFull int `json:"ud_dropped_queue_full,omitempty"`
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
	p.stderr, p.tty = os.Stderr, isTerminal(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	stopProf := record("--cpuprofile", p.cpuProf, pprof.StartCPUProfile, pprof.StopCPUProfile)
	defer stopProf()
	stopTrace := record("--trace", p.trace, trace.Start, trace.Stop)
	defer stopTrace()
	if err := run(ctx, p); err != nil {
		stopTrace()
		stopProf()
		fmt.Fprintln(os.Stderr, "rdmaperf:", err)
		os.Exit(1)
	}
}

// record starts a recording of the run (a CPU profile, an execution
// trace) into the file at path, if one is given, and returns what ends
// it; a second call of that does nothing. A file that cannot be written
// ends the program.
func record(flag, path string, start func(io.Writer) error, stop func()) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = start(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmaperf: %s: %v\n", flag, err)
		os.Exit(1)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			stop()
			f.Close()
		})
	}
}

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: rdmaperf TEST [flags] [HOST]   (server without HOST, client with it)")
	fmt.Fprintln(w, "tests: write_bw send_bw read_bw atomic_bw write_lat send_lat read_lat")
	fmt.Fprintln(w, "--api=stream runs send_bw and send_lat only; so does -c UD (--api verbs or async)")
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
	fs.IntVar(&p.rxDepth, "r", 512, "receives kept posted (send tests; -c UD: default -n, up to 16000, as perftest's)")
	fs.IntVar(&p.postList, "l", 1, "post list: WRs per post call (verbs API; batch size for async)")
	fs.IntVar(&p.cqMod, "Q", 0, "CQ moderation: signal one WR in Q (default 100 bw, 1 lat; verbs API)")
	fs.StringVar(&p.device, "d", "", "device name (default: the first usable)")
	fs.IntVar(&p.ibPort, "i", 1, "device port")
	fs.IntVar(&p.gidIndex, "x", -1, "GID index (default: the first RoCE v2 IPv4 GID)")
	fs.IntVar(&p.port, "p", 18515, "TCP port of the out-of-band exchange (async API and stream: also -p+1)")
	fs.BoolVar(&p.gbits, "report_gbits", false, "report bandwidth in Gb/s (10^9 bit/s) instead of MiB/s")
	fs.StringVar(&p.outJSON, "out_json", "", "also write the results as JSON to this file")
	fs.StringVar(&p.api, "api", "verbs", "verbs (raw provider), async (rdma.Conn futures and batches) or stream (net.Conn; send_bw, send_lat)")
	fs.StringVar(&p.provider, "provider", "auto", "soft, verbs or auto")
	fs.StringVar(&p.pollMode, "poll", "busy", "async API and stream poll mode: busy, adaptive or event")
	fs.Var(&p.locked, "poller_lock", "async API and stream: pollers locked to OS threads, true or false (rdma.WithPollerThreadLock); auto: the library's default, Busy pollers only")
	fs.DurationVar(&p.timeout, "timeout", 2*time.Minute, "give up when the peer does not answer for this long")
	fs.IntVar(&p.inline, "I", 0, "send and write messages up to this size inline (verbs API; the QP is created with this much inline data)")
	fs.BoolVar(&p.events, "e", false, "wait for completion events instead of busy polling (verbs: CQ completion channel; async, stream: --poll event)")
	fs.IntVar(&p.posters, "g", 1, "goroutines posting the operations as Futures, each tx depth/g deep (async API bw tests, -l 1): concurrent posts, which the async API combines into one doorbell")
	fs.BoolVar(&p.floor, "floor", false, "print what one call into the provider (a cgo call with the verbs provider) and one empty poll inside it take on the device, and exit: the floor under the raw verbs path's figures (no peer)")
	fs.IntVar(&p.qps, "q", 1, "queue pairs for the bw tests, traffic round robin, tx depth each (async API: connections)")
	fs.StringVar(&p.cpuProf, "cpuprofile", "", "write a pprof CPU profile of the run to this file (go tool pprof)")
	fs.StringVar(&p.trace, "trace", "", "write an execution trace of the run to this file (go tool trace)")
	fs.BoolVar(&p.stats, "stats", false, "print the pollers' and each async or stream connection's counters (rdma.ConnStats) to stderr at the end")
	tf := transportFlag{ud: &p.ud}
	fs.Var(tf, "c", "connection type: RC, or UD (send_bw and send_lat: unreliable datagrams of up to the path MTU, as perftest's -c UD)")
	fs.Var(tf, "connection", "the same as -c")
	fs.Var(tf, "transport", "the same as -c")
	noProgress := fs.Bool("no_progress", false, "no progress line on stderr (shown once per second with -D, or once a size has run 2 s)")
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
	p.progress = !*noProgress
	p.progressAfter, p.progressEvery = 2*time.Second, time.Second
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
	case p.isLat && p.cqMod > p.txDepth+16:
		return nil, fmt.Errorf("-Q %d: a latency test's send queue holds -t + 16 = %d WRs, and room comes back only with a signaled one; want at most that", p.cqMod, p.txDepth+16)
	case p.api != "verbs" && p.api != "async" && p.api != "stream":
		return nil, fmt.Errorf("--api %q: want verbs, async or stream", p.api)
	case p.provider != "auto" && p.provider != "soft" && p.provider != "verbs":
		return nil, fmt.Errorf("--provider %q: want soft, verbs or auto", p.provider)
	case p.pollMode != "busy" && p.pollMode != "adaptive" && p.pollMode != "event":
		return nil, fmt.Errorf("--poll %q: want busy, adaptive or event", p.pollMode)
	case p.port < 1 || p.port > 65534:
		return nil, fmt.Errorf("-p %d: want 1..65534", p.port)
	case p.inline < 0:
		return nil, fmt.Errorf("-I %d: want bytes >= 0", p.inline)
	case p.qps < 1 || p.qps > 256:
		return nil, fmt.Errorf("-q %d: want 1..256", p.qps)
	case p.posters < 1 || p.posters > 256:
		return nil, fmt.Errorf("-g %d: want 1..256", p.posters)
	}
	if err := p.checkCombinations(); err != nil {
		return nil, err
	}
	if p.isLat && p.txDepth != 1 {
		return nil, fmt.Errorf("-t %d: latency tests keep one operation in flight", p.txDepth)
	}
	if p.test == "atomic_bw" && p.all {
		return nil, fmt.Errorf("-a: atomic_bw has one size, 8 B")
	}
	if p.ud && !p.setFlags["r"] && p.duration == 0 {
		// As perftest's -c UD: a receive posted per iteration (up to
		// 16000), so that the receiver of send_bw does not run out of
		// them as long as it keeps up with the device; UD has no flow
		// control, a datagram that finds none is lost.
		p.rxDepth = min(p.iters, udMaxRx)
	}
	// The post list and the signaling period must fit the tx depth, and
	// a signaled WR must be in flight whenever the window is full.
	p.postList = min(p.postList, p.txDepth)
	p.cqMod = max(1, min(p.cqMod, p.txDepth-p.postList+1))
	return p, nil
}

// checkCombinations refuses the flags that do not apply to the test or
// the API, and maps -e onto the async API's poll mode.
func (p *params) checkCombinations() error {
	if p.isLat && p.qps > 1 {
		return fmt.Errorf("-q %d: latency tests run on one QP (as perftest's)", p.qps)
	}
	if p.posters > 1 {
		switch {
		case p.api != "async" || p.isLat:
			return fmt.Errorf("-g %d: concurrent posters are for the async API's bandwidth tests", p.posters)
		case p.postList > 1:
			return fmt.Errorf("-g %d: each poster posts Futures one by one; -l %d asks for Batches", p.posters, p.postList)
		case p.setFlags["D"]:
			return fmt.Errorf("-g %d: posters run -n operations, not -D seconds", p.posters)
		}
	}
	if p.inline > 0 {
		switch {
		case p.test != "write_bw" && p.test != "send_bw" && p.test != "write_lat" && p.test != "send_lat":
			return fmt.Errorf("-I %d: inline data applies to SEND and WRITE only, not to %s", p.inline, p.test)
		case p.api == "async":
			return fmt.Errorf("-I %d: the async API has no inline option (rdma.Conn decides by itself which SENDs go inline); use --api=verbs", p.inline)
		case p.api == "stream":
			return fmt.Errorf("-I %d: the stream has no inline option; use --api=verbs", p.inline)
		}
	}
	if p.events {
		switch {
		case p.api == "verbs" && p.test == "write_lat":
			return errors.New("-e: write_lat detects each answer by spinning on memory, as ib_write_lat does: there is no completion to wait for (use send_lat or read_lat, or --api=async)")
		case p.api != "verbs" && p.setFlags["poll"] && p.pollMode != "event":
			return fmt.Errorf("-e asks for the event poll mode, --poll %s for another", p.pollMode)
		case p.api != "verbs":
			p.pollMode = "event"
		}
	}
	if p.ud {
		if err := p.checkUD(); err != nil {
			return err
		}
	}
	if p.api == "stream" {
		if p.test != "send_bw" && p.test != "send_lat" {
			return fmt.Errorf("--api=stream measures send_bw and send_lat only (a byte stream has no %s)", strings.TrimSuffix(strings.TrimSuffix(p.test, "_bw"), "_lat"))
		}
		if p.qps > 1 {
			return fmt.Errorf("-q %d: --api=stream runs one stream", p.qps)
		}
		for _, f := range []string{"t", "l", "Q", "r"} {
			if p.setFlags[f] {
				return fmt.Errorf("-%s does not apply to --api=stream: the stream keeps its own window of messages (docs/stream.md)", f)
			}
		}
	}
	return nil
}

// sizes are the message sizes of the run: -s, or 2 B..8 MiB with -a
// (over UD up to the path MTU).
func (p *params) sizes() []int {
	if !p.all {
		return []int{p.size}
	}
	top := 8 << 20
	if p.udMTU > 0 {
		top = p.udMTU
	}
	var s []int
	for n := 2; n <= top; n *= 2 {
		s = append(s, n)
	}
	return s
}

func (p *params) maxSize() int {
	s := p.sizes()
	return s[len(s)-1]
}

func run(ctx context.Context, p *params) error {
	if p.floor {
		return runFloor(p)
	}
	var results []result
	var err error
	switch {
	case p.ud && p.api == "async":
		results, err = runUDAsync(ctx, p)
	case p.api == "verbs":
		results, err = runRaw(ctx, p)
	case p.api == "stream":
		results, err = runStream(ctx, p)
	default:
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
