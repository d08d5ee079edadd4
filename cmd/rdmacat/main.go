// Command rdmacat is netcat for RDMA: it connects standard input and
// standard output to a go-rdma stream (stream.Dial, stream.Listen).
//
//	rdmacat -l :9999 > out          # receive: accept one peer, write what it sends
//	rdmacat host:9999 < in          # send: connect, send stdin
//	tar c dir | rdmacat host:9999   # in any pipeline
//
// Both directions run at once: stdin goes to the peer and what the peer
// sends goes to stdout. When stdin ends, rdmacat half-closes the stream
// (the peer reads EOF); it exits when both directions are done: stdin has
// been sent and the peer has closed its side. -d sends nothing, so a
// receiver does not wait for its own stdin. With -v it reports progress
// once a second and a summary with throughput on stderr; with -l -v the
// first line on stderr is "rdmacat: listening on ADDR".
//
// The provider is chosen by -provider (or $RDMA_PROVIDER): "auto" takes a
// usable RDMA device and falls back to the soft provider, which runs
// anywhere; both ends must use the same provider.
//
// Exit codes: 0 success; 1 the connection failed (dial, accept, reset by
// the peer, transfer error); 2 bad usage; 3 reading stdin or writing
// stdout failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// Exit codes.
const (
	exitOK    = 0
	exitConn  = 1
	exitUsage = 2
	exitLocal = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	listen   bool
	addr     string
	verbose  bool
	noStdin  bool
	provider string
	device   string
	timeout  time.Duration
	ring     int
	depth    int
	cpuprof  string
}

func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("rdmacat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rdmacat [flags] host:port      connect, send stdin, write what comes back to stdout\n"+
			"       rdmacat -l [flags] [host]:port  accept one connection, the same\n")
		fs.PrintDefaults()
	}
	fs.BoolVar(&cfg.listen, "l", false, "listen for one connection instead of connecting")
	fs.BoolVar(&cfg.verbose, "v", false, "report progress and throughput on stderr")
	fs.BoolVar(&cfg.noStdin, "d", false, "do not read stdin: send nothing, only receive")
	fs.StringVar(&cfg.provider, "provider", "", "provider: auto, verbs or soft (default $RDMA_PROVIDER, else auto)")
	fs.StringVar(&cfg.device, "device", "", "RDMA device name (default: by address)")
	fs.DurationVar(&cfg.timeout, "w", 30*time.Second, "connect timeout (with -l: no limit)")
	fs.IntVar(&cfg.ring, "ring", 0, "bytes of the receive ring each side exposes (default 2 MiB)")
	fs.IntVar(&cfg.depth, "depth", 0, "receive depth; the send depth is twice it (default 32)")
	fs.StringVar(&cfg.cpuprof, "cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return cfg, false
	}
	cfg.addr = fs.Arg(0)
	return cfg, true
}

func (cfg config) options() []rdma.Option {
	var opts []rdma.Option
	if cfg.provider != "" {
		opts = append(opts, rdma.WithProvider(cfg.provider))
	}
	if cfg.device != "" {
		opts = append(opts, rdma.WithDevice(cfg.device))
	}
	if cfg.depth != 0 {
		opts = append(opts, rdma.WithQueueDepth(2*cfg.depth, cfg.depth))
	}
	return opts
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return exitUsage
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "rdmacat: "+format+"\n", a...) }
	if cfg.cpuprof != "" {
		stop, err := startCPUProfile(cfg.cpuprof)
		if err != nil {
			logf("%v", err)
			return exitLocal
		}
		defer stop()
	}
	conn, err := connect(ctx, cfg, logf)
	if err != nil {
		logf("%v", err)
		if errors.Is(err, rdma.ErrInvalid) {
			return exitUsage
		}
		return exitConn
	}
	defer conn.Close()
	sc := conn.(*stream.Conn)
	if cfg.verbose {
		if rc := sc.RDMAConn(); rc != nil {
			logf("connected %v -> %v (%s provider, %s)", conn.LocalAddr(), conn.RemoteAddr(), rc.Provider(), rc.Device())
		} else {
			logf("connected %v -> %v (TCP fallback: no RDMA device)", conn.LocalAddr(), conn.RemoteAddr())
		}
	}
	// Ctrl-C ends both directions.
	stopOnCancel := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopOnCancel()

	var sent, received atomic.Int64
	start := time.Now()
	type result struct {
		err   error
		local bool
	}
	sendDone := make(chan result, 1)
	go func() {
		var r result
		if !cfg.noStdin {
			// Straight from stdin into registered memory.
			_, err := sc.ReadFrom(countingReader{r: stdin, n: &sent})
			r.err, r.local = err, err != nil && !isConnErr(err)
		}
		if err := sc.CloseWrite(); err != nil && r.err == nil {
			r.err = err
		}
		sendDone <- r
	}()
	done := make(chan struct{})
	if cfg.verbose {
		go progress(done, start, &sent, &received, logf)
	}
	var sendErr, recvErr error
	var sendLocal, recvLocal bool
	// Straight from the ring to stdout.
	_, recvErr = sc.WriteTo(counter{w: stdout, n: &received})
	recvLocal = recvErr != nil && !isConnErr(recvErr)
	if recvErr == nil {
		// The peer closed its side in order: finish sending stdin.
		r := <-sendDone
		sendErr, sendLocal = r.err, r.local
	} else {
		// Nothing more will come, and the connection is of no more
		// use: do not wait for stdin.
		conn.Close()
		select {
		case r := <-sendDone:
			sendErr, sendLocal = r.err, r.local
		default:
		}
	}
	close(done)
	el := time.Since(start)
	if cfg.verbose {
		logf("sent %d bytes, received %d bytes in %v (%s out, %s in)", sent.Load(), received.Load(),
			el.Round(time.Millisecond), rate(sent.Load(), el), rate(received.Load(), el))
	}
	code := exitOK
	for _, e := range []struct {
		err   error
		local bool
		what  string
	}{{recvErr, recvLocal, "receive"}, {sendErr, sendLocal, "send"}} {
		if e.err == nil || ctx.Err() != nil && !e.local {
			continue
		}
		logf("%s: %v", e.what, e.err)
		if e.local {
			code = max(code, exitLocal)
		} else if code == exitOK {
			code = exitConn
		}
	}
	if ctx.Err() != nil && code == exitOK {
		logf("interrupted")
		code = exitConn
	}
	return code
}

// connect dials, or listens and accepts one connection.
func connect(ctx context.Context, cfg config, logf func(string, ...any)) (net.Conn, error) {
	if !cfg.listen {
		dctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		d := stream.Dialer{Options: cfg.options(), RingSize: cfg.ring}
		return d.DialContext(dctx, "rdma", cfg.addr)
	}
	lc := stream.ListenConfig{Options: cfg.options(), RingSize: cfg.ring}
	ln, err := lc.Listen(ctx, "rdma", cfg.addr)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	if cfg.verbose {
		logf("listening on %v", ln.Addr())
	}
	return ln.(*stream.Listener).AcceptContext(ctx)
}

// isConnErr says whether err is the connection's (a *net.OpError of the
// stream) rather than stdin's or stdout's.
func isConnErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type counter struct {
	w io.Writer
	n *atomic.Int64
}

func (c counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func progress(done <-chan struct{}, start time.Time, sent, received *atomic.Int64, logf func(string, ...any)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			el := time.Since(start)
			logf("%v: sent %d bytes (%s), received %d bytes (%s)", el.Round(time.Second),
				sent.Load(), rate(sent.Load(), el), received.Load(), rate(received.Load(), el))
		}
	}
}

// startCPUProfile writes a CPU profile to path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func rate(n int64, el time.Duration) string {
	if el <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f Gb/s", float64(n)*8/el.Seconds()/1e9)
}
