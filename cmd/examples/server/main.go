// Command server is the serving half of a small RDMA protocol; its
// partner is cmd/examples/client. Run them in two processes or on two
// hosts:
//
//	server -addr :7471            # serve until SIGINT or SIGTERM
//	server -addr :7471 -n 3       # serve 3 clients, then exit
//	client -addr host:7471 -name alice
//
// For every client the server exposes a scratch region that the client
// may WRITE and READ, and an 8-byte counter shared by all clients, which
// they increment with FetchAdd. Requests and replies are short text
// messages carried by Send and Recv:
//
//	HELLO name   -> WELCOME name, you are client N
//	SUM off n    -> SUM <sha256 of scratch[off:off+n]>
//	UPPER off n  -> OK n   (scratch[off:off+n] upper-cased in place)
//	STATS        -> STATS clients=... active=... requests=... counter=...
//	BYE          -> BYE after N requests
//
// A completed WRITE only means the bytes are in the server's memory; the
// SUM or UPPER request that follows it on the same connection is what
// tells the server to look, and RC delivers it after the data.
//
// The server serves clients concurrently. On SIGINT or SIGTERM it stops
// accepting (closing the listener), tells each client "SHUTDOWN" and
// closes its connection. Exit codes: 0 after a clean shutdown, 1 on
// errors, 2 on bad usage.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdma"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what the flags say.
type config struct {
	addr     string
	n        int
	region   int
	provider string
	poll     rdma.PollMode
}

// parse reads the flags; a usage error is reported to stderr and gives
// ok == false.
func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: server -addr host:port [-n clients] [-region bytes] [-provider auto|verbs|soft] [-poll adaptive|busy|event]\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.addr, "addr", "", "address to listen on, host:port (required)")
	fs.IntVar(&cfg.n, "n", 0, "serve this many clients, then exit (0: until SIGINT/SIGTERM)")
	fs.IntVar(&cfg.region, "region", 64<<10, "bytes of scratch memory exposed to each client")
	fs.StringVar(&cfg.provider, "provider", rdma.ProviderAuto, "RDMA provider: auto, verbs or soft")
	poll := fs.String("poll", "adaptive", "completion polling: adaptive, busy or event")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	bad := func(format string, a ...any) (config, bool) {
		fmt.Fprintf(stderr, "server: "+format+"\n", a...)
		fs.Usage()
		return cfg, false
	}
	var err error
	switch {
	case fs.NArg() > 0:
		return bad("unexpected arguments %q", fs.Args())
	case cfg.addr == "":
		return bad("-addr is required")
	case cfg.n < 0:
		return bad("-n %d: want 0 or more", cfg.n)
	case cfg.region < 8 || cfg.region > 1<<30:
		return bad("-region %d: want 8 B..1 GiB", cfg.region)
	case cfg.provider != rdma.ProviderAuto && cfg.provider != rdma.ProviderVerbs && cfg.provider != rdma.ProviderSoft:
		return bad("-provider %q: want auto, verbs or soft", cfg.provider)
	}
	if cfg.poll, err = rdma.ParsePollMode(*poll); err != nil {
		return bad("-poll: %v", err)
	}
	return cfg, true
}

// run serves until ctx ends or cfg.n clients have come and gone, and
// returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return 2
	}
	s := &server{cfg: cfg, log: log.New(stdout, "server: ", 0)}
	if err := s.serve(ctx); err != nil {
		fmt.Fprintln(stderr, "server:", err)
		return 1
	}
	return 0
}

type server struct {
	cfg config
	log *log.Logger

	mu      sync.Mutex
	counter *rdma.Buffer // the word every client's FetchAdd hits
	conns   map[*rdma.Conn]struct{}

	clients  atomic.Int64 // accepted so far
	active   atomic.Int64
	requests atomic.Int64
	shutdown chan struct{} // closed once ctx ended and the shutdown is logged
}

func (s *server) serve(ctx context.Context) error {
	ln, err := rdma.Listen("rdma", s.cfg.addr, rdma.WithProvider(s.cfg.provider), rdma.WithPollMode(s.cfg.poll),
		rdma.WithMaxMessage(1024), rdma.WithRegionLimit(0))
	if err != nil {
		return err
	}
	s.conns = map[*rdma.Conn]struct{}{}
	s.log.Printf("listening on %s (provider %s, poll %v)", ln.Addr(), ln.Provider(), s.cfg.poll)

	// ctx ends at SIGINT or SIGTERM. The handlers hear of it through
	// shutdown, after the log says how many connections it closes.
	s.shutdown = make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		s.log.Printf("shutting down: closing %d connections", s.active.Load())
		close(s.shutdown)
	})
	defer stop()
	var wg sync.WaitGroup
	var acceptErr error
	for s.cfg.n == 0 || int(s.clients.Load()) < s.cfg.n {
		conn, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() == nil {
				acceptErr = err
			}
			break
		}
		id := s.clients.Add(1)
		s.active.Add(1)
		s.mu.Lock()
		s.conns[conn] = struct{}{}
		s.mu.Unlock()
		wg.Go(func() { s.handle(ctx, id, conn) })
	}
	// Stop accepting. Connections already accepted keep the shared device
	// and pool alive until they close.
	ln.Close()
	switch {
	case acceptErr != nil:
		s.log.Printf("accept: %v; closing %d connections", acceptErr, s.active.Load())
		s.closeAll()
	case ctx.Err() != nil:
		// The handlers see shutdown, say SHUTDOWN and close their
		// connections; close what is left after a grace period.
		grace := time.AfterFunc(3*time.Second, s.closeAll)
		defer grace.Stop()
	default:
		s.log.Printf("served %d clients; waiting for %d to finish", s.clients.Load(), s.active.Load())
	}
	wg.Wait()
	s.mu.Lock()
	var total uint64
	if s.counter != nil {
		// Every connection is closed: nobody else touches the word now.
		// Atomics use the byte order of the host that owns the memory.
		total = binary.NativeEndian.Uint64(s.counter.Bytes())
		s.counter.Release()
		s.counter = nil
	}
	s.mu.Unlock()
	if !stop() && ctx.Err() != nil {
		// AfterFunc runs in a goroutine of its own: the shutdown is
		// logged before the end.
		<-s.shutdown
	}
	s.log.Printf("done: %d clients, %d requests, counter = %d", s.clients.Load(), s.requests.Load(), total)
	return acceptErr
}

// closeAll closes every open connection; their handlers then return.
func (s *server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

// sharedCounter allocates the shared counter on first use. All
// connections of a Listener share its buffer pool, so memory allocated
// through one connection can be exposed on another.
func (s *server) sharedCounter(c *rdma.Conn) (*rdma.Buffer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counter == nil {
		b, err := c.Alloc(8)
		if err != nil {
			return nil, err
		}
		clear(b.Bytes())
		s.counter = b
	}
	return s.counter, nil
}

// handle serves one client until it says BYE and goes, fails, or the
// server shuts down.
func (s *server) handle(ctx context.Context, id int64, conn *rdma.Conn) {
	defer s.active.Add(-1)
	var pending *rdma.Future // a receive we stopped waiting for
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		// Close resolves every pending future; a receive that got a
		// message after all still hands us its buffer.
		conn.Close()
		if pending != nil && pending.Buffer() != nil {
			pending.Buffer().Release()
		}
	}()
	who := fmt.Sprintf("client %d (%s)", id, conn.RemoteAddr())
	s.log.Printf("%s connected", who)

	scratch, err := conn.Alloc(s.cfg.region)
	if err != nil {
		s.log.Printf("%s: %v", who, err)
		return
	}
	defer scratch.Release()
	clear(scratch.Bytes())
	counter, err := s.sharedCounter(conn)
	if err != nil {
		s.log.Printf("%s: %v", who, err)
		return
	}
	// Expose exactly what the client needs, with exactly those rights;
	// closing the connection revokes both.
	area, err := conn.Expose(scratch, rdma.RemoteRead|rdma.RemoteWrite)
	if err == nil {
		var word rdma.RemoteRegion
		if word, err = conn.Expose(counter, rdma.RemoteAtomic); err == nil {
			if err = conn.SendRegion(ctx, area); err == nil {
				err = conn.SendRegion(ctx, word)
			}
		}
	}
	if err != nil {
		s.log.Printf("%s: exposing memory: %v", who, err)
		return
	}

	served := 0
	for {
		f := conn.Recv()
		select {
		case <-f.Done():
		case <-s.shutdown:
			// Shutting down: say so (bounded) and close. The pending
			// receive resolves with an error when the connection closes.
			s.reply(conn, "SHUTDOWN server is shutting down")
			s.log.Printf("%s: closed by shutdown after %d requests", who, served)
			pending = f
			return
		}
		if err := f.Err(); err != nil {
			s.log.Printf("%s gone after %d requests: %v", who, served, err)
			return
		}
		if f.Buffer() == nil {
			// A WRITE_WITH_IMM, not a request: this protocol has none.
			imm, _ := f.Imm()
			s.log.Printf("%s: ignoring a write with immediate %d", who, imm)
			continue
		}
		req := string(f.Buffer().Bytes())
		f.Buffer().Release()
		served++
		s.requests.Add(1)
		resp := s.answer(id, scratch, req, served)
		s.log.Printf("%s: %q -> %q", who, req, resp)
		err := s.reply(conn, resp)
		if strings.HasPrefix(req, "BYE") {
			// The client closes as soon as it has the reply, maybe before
			// its side acknowledged it, so the send may fail although
			// the reply arrived. Give it a moment to go, then close.
			f := conn.Recv()
			wait, cancel := context.WithTimeout(ctx, 5*time.Second)
			f.Wait(wait)
			cancel()
			pending = f
			s.log.Printf("%s left after %d requests", who, served)
			return
		}
		if err != nil {
			s.log.Printf("%s: reply: %v", who, err)
			return
		}
	}
}

// answer computes the reply to one request.
func (s *server) answer(id int64, scratch *rdma.Buffer, req string, served int) string {
	verb, args, _ := strings.Cut(req, " ")
	span := func() ([]byte, error) {
		f := strings.Fields(args)
		if len(f) != 2 {
			return nil, errors.New("want offset and length")
		}
		off, err1 := strconv.Atoi(f[0])
		n, err2 := strconv.Atoi(f[1])
		mem := scratch.Bytes()
		if err1 != nil || err2 != nil || off < 0 || n < 0 || off > len(mem) || n > len(mem)-off {
			return nil, fmt.Errorf("range %s outside the %d-byte region", args, len(mem))
		}
		return mem[off : off+n], nil
	}
	switch verb {
	case "HELLO":
		return fmt.Sprintf("WELCOME %s, you are client %d", args, id)
	case "SUM":
		b, err := span()
		if err != nil {
			return "ERR " + err.Error()
		}
		sum := sha256.Sum256(b)
		return "SUM " + hex.EncodeToString(sum[:])
	case "UPPER":
		b, err := span()
		if err != nil {
			return "ERR " + err.Error()
		}
		copy(b, bytes.ToUpper(b))
		return fmt.Sprintf("OK %d", len(b))
	case "STATS":
		return fmt.Sprintf("STATS clients=%d active=%d requests=%d", s.clients.Load(), s.active.Load(), s.requests.Load())
	case "BYE":
		return fmt.Sprintf("BYE after %d requests", served)
	}
	return fmt.Sprintf("ERR unknown request %q", verb)
}

// reply sends one text message and waits (bounded) for it to complete.
func (s *server) reply(conn *rdma.Conn, msg string) error {
	b, err := conn.Alloc(len(msg))
	if err != nil {
		return err
	}
	copy(b.Bytes(), msg)
	f := conn.Send(b)
	b.Release() // the send keeps the memory until it completes
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return f.Wait(ctx)
}
