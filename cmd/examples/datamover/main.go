// Command datamover copies a file, or generated data, to a receiver over
// RDMA with N goroutines, using WRITE_WITH_IMM.
//
//	datamover -l :9999 -o out.bin                    # receive one transfer
//	datamover -addr host:9999 -i in.bin -j 4         # send a file
//	datamover -addr host:9999 -gen 1GiB -chunk 4MiB  # send generated data
//	datamover -self -gen 256MiB -j 4                 # both ends, one process
//
// How it works:
//
//  1. The sender says how much it will send and in which chunk size.
//  2. The receiver allocates a destination region, exposes it to the
//     sender for RemoteWrite and answers with the region. When the data
//     is larger than -window, the region is two slots of about -window/2
//     bytes each, and the data goes in windows of one slot each.
//  3. At most -j workers at once WRITE_WITH_IMM the chunks, each
//     from its own registered buffer, with the chunk's index as the
//     immediate value. Every such write resolves one Recv on the receiver,
//     whose future has no buffer and whose Imm is the index: that is how
//     the receiver counts what has arrived.
//  4. A completed WRITE only means the bytes are in the receiver's memory,
//     not that the receiver has used them. Once all chunks of a window
//     have arrived, the receiver hashes the window, writes it to -o and
//     then sends "window consumed" (a Send). The sender writes window w
//     into a slot only after the receiver consumed window w-2, which used
//     the same slot.
//  5. The sender then sends the checksum of its data (SHA-256, or with
//     -sum crc32c the much cheaper CRC-32C); the receiver compares it with
//     its own over the bytes it received and answers with the verdict. The output file appears under its name (from a ".part"
//     file) only when the checksums match.
//
// Progress goes to stderr (at most 5 updates a second, redrawn in place on
// a terminal, one line a second otherwise); results go to stdout.
// Exit codes: 0 when the receiver verified the checksum, 1 on errors or a
// mismatch, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/go-rdma/rdma"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	listen   string // receive mode
	addr     string // send mode
	self     bool   // both
	in       string
	gen      int64 // bytes to generate; -1 when -gen is not given
	out      string
	jobs     int
	chunk    int
	window   int64
	quiet    bool
	provider string
	poll     rdma.PollMode
	sum      checksum
	cpuprof  string
}

func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("datamover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage:
  datamover -l host:port [-o file] [-window size]               receive
  datamover -addr host:port (-i file | -gen size) [-j n] [-chunk size]  send
  datamover -self (-i file | -gen size) [-o file] [-j n] [-chunk size] [-window size]
sizes take a suffix: 4096, 64KiB, 1MiB, 1GiB (also K, M, G; KB, MB, GB are powers of 1000)
`)
		fs.PrintDefaults()
	}
	gen := sizeFlag{v: -1}
	chunk := sizeFlag{v: 1 << 20}
	window := sizeFlag{v: 64 << 20}
	fs.StringVar(&cfg.listen, "l", "", "receive: listen on host:port for one transfer")
	fs.StringVar(&cfg.addr, "addr", "", "send: the receiver's host:port")
	fs.BoolVar(&cfg.self, "self", false, "send to a receiver in this process over loopback")
	fs.StringVar(&cfg.in, "i", "", "send: the file to send")
	fs.Var(&gen, "gen", "send: generate this many bytes instead of reading a file")
	fs.StringVar(&cfg.out, "o", "", "receive: write the data to this file (default: verify only)")
	fs.IntVar(&cfg.jobs, "j", 4, "send: workers (and chunks in flight)")
	fs.Var(&chunk, "chunk", "send: chunk size, one WRITE_WITH_IMM each")
	fs.Var(&window, "window", "receive: destination region size; larger data goes in windows")
	fs.BoolVar(&cfg.quiet, "q", false, "no progress bar")
	fs.StringVar(&cfg.provider, "provider", rdma.ProviderAuto, "RDMA provider: auto, verbs or soft")
	poll := fs.String("poll", "adaptive", "completion polling: adaptive, busy or event")
	sum := fs.String("sum", "sha256", "send: how both ends check the data: sha256 or crc32c (faster)")
	fs.StringVar(&cfg.cpuprof, "cpuprofile", "", "write a CPU profile to this file")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	cfg.gen, cfg.window = gen.v, window.v
	bad := func(format string, a ...any) (config, bool) {
		fmt.Fprintf(stderr, "datamover: "+format+"\n", a...)
		fs.Usage()
		return cfg, false
	}
	modes := 0
	for _, on := range []bool{cfg.listen != "", cfg.addr != "", cfg.self} {
		if on {
			modes++
		}
	}
	sending := cfg.addr != "" || cfg.self
	var err error
	switch {
	case fs.NArg() > 0:
		return bad("unexpected arguments %q", fs.Args())
	case modes != 1:
		return bad("give exactly one of -l, -addr and -self")
	case sending && (cfg.in == "") == (cfg.gen < 0):
		return bad("give exactly one of -i and -gen")
	case !sending && (cfg.in != "" || cfg.gen >= 0):
		return bad("-i and -gen are for sending")
	case cfg.addr != "" && cfg.out != "":
		return bad("-o is for receiving")
	case cfg.jobs < 1 || cfg.jobs > 1024:
		return bad("-j %d: want 1..1024", cfg.jobs)
	case chunk.v < 1<<10 || chunk.v > 1<<30:
		return bad("-chunk %d: want 1KiB..1GiB", chunk.v)
	case cfg.window < 1<<10 || cfg.window > 1<<40:
		return bad("-window %d: want 1KiB..1TiB", cfg.window)
	case cfg.provider != rdma.ProviderAuto && cfg.provider != rdma.ProviderVerbs && cfg.provider != rdma.ProviderSoft:
		return bad("-provider %q: want auto, verbs or soft", cfg.provider)
	}
	cfg.chunk = int(chunk.v)
	if cfg.poll, err = rdma.ParsePollMode(*poll); err != nil {
		return bad("-poll: %v", err)
	}
	if cfg.sum, err = parseChecksum(*sum); err != nil {
		return bad("-sum: %v", err)
	}
	return cfg, true
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return 2
	}
	if cfg.cpuprof != "" {
		f, err := os.Create(cfg.cpuprof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "datamover:", err)
			return 1
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if err := dispatch(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "datamover:", err)
		return 1
	}
	return 0
}

func dispatch(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	opts := []rdma.Option{rdma.WithProvider(cfg.provider), rdma.WithPollMode(cfg.poll),
		// Messages are small; WRITE_WITH_IMM notifications use receives
		// too, so keep plenty posted.
		rdma.WithMaxMessage(maxMsg), rdma.WithQueueDepth(max(128, 2*cfg.jobs), 512),
		rdma.WithRegionLimit(0)}
	tty := isTerminal(stderr)
	if cfg.listen != "" {
		ln, err := rdma.Listen("rdma", cfg.listen, opts...)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Fprintf(stdout, "datamover: listening on %s (provider %s)\n", ln.Addr(), ln.Provider())
		r := &receiver{out: cfg.out, window: cfg.window, log: stdout, progress: progressTo(stderr, cfg.quiet, tty)}
		return r.run(ctx, ln)
	}

	src, err := openSource(cfg)
	if err != nil {
		return err
	}
	defer src.Close()
	s := &sender{src: src, sum: cfg.sum, chunk: cfg.chunk, jobs: cfg.jobs, log: stdout, progress: progressTo(stderr, cfg.quiet, tty)}
	if !cfg.self {
		return s.run(ctx, cfg.addr, opts)
	}

	// -self: a receiver in a goroutine, the sender in another, over
	// loopback. The first error cancels the other side.
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	if err != nil {
		return err
	}
	defer ln.Close()
	r := &receiver{out: cfg.out, window: cfg.window, log: stdout, progress: progressTo(stderr, true, tty)}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.run(gctx, ln) })
	g.Go(func() error { return s.run(gctx, ln.Addr().String(), opts) })
	return g.Wait()
}

// progressTo returns how a side reports progress: nothing when quiet.
func progressTo(w io.Writer, quiet, tty bool) func(label string, total int64) *progress {
	if quiet {
		w = nil
	}
	return func(label string, total int64) *progress { return startProgress(w, tty, label, total) }
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// source is what the sender sends: a file or generated data.
type source interface {
	io.ReaderAt
	io.Closer
	Size() int64
	Name() string
}

func openSource(cfg config) (source, error) {
	if cfg.gen >= 0 {
		return genSource{size: cfg.gen}, nil
	}
	f, err := os.Open(cfg.in)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: not a regular file", cfg.in)
	}
	return fileSource{File: f, size: fi.Size()}, nil
}

type fileSource struct {
	*os.File
	size int64
}

func (f fileSource) Size() int64  { return f.size }
func (f fileSource) Name() string { return filepath.Base(f.File.Name()) }

// errMismatch is a checksum that did not match.
var errMismatch = errors.New("checksum mismatch")
