// Command client is the calling half of the protocol served by
// cmd/examples/server (see its documentation):
//
//	server -addr :7471
//	client -addr host:7471 -name alice -rounds 3
//
// The client receives two regions from the server: a scratch area it may
// WRITE and READ, and a counter shared by every client. It takes a ticket
// from the counter with FetchAdd, then, for each round, WRITEs a payload
// into the scratch area, asks the server for its checksum (SUM) and
// compares it with its own, asks the server to upper-case it in place
// (UPPER) and READs the result back. Requests and replies are messages
// sent with Send and received with Recv. It says BYE, reads the reply and
// closes.
//
// Exit codes: 0 when every reply checked out, 1 on errors or a mismatch,
// 2 on bad usage.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
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

type config struct {
	addr     string
	name     string
	size     int
	rounds   int
	timeout  time.Duration
	provider string
	poll     rdma.PollMode
}

func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: client -addr host:port [-name name] [-size bytes] [-rounds n] [-provider auto|verbs|soft] [-poll adaptive|busy|event]\n")
		fs.PrintDefaults()
	}
	host, _ := os.Hostname()
	fs.StringVar(&cfg.addr, "addr", "", "server address, host:port (required)")
	fs.StringVar(&cfg.name, "name", fmt.Sprintf("%s/%d", host, os.Getpid()), "name to greet the server with")
	fs.IntVar(&cfg.size, "size", 4096, "payload bytes per round (at most the server's -region)")
	fs.IntVar(&cfg.rounds, "rounds", 1, "write/sum/upper/read rounds")
	fs.DurationVar(&cfg.timeout, "timeout", 30*time.Second, "bound on the whole session")
	fs.StringVar(&cfg.provider, "provider", rdma.ProviderAuto, "RDMA provider: auto, verbs or soft")
	poll := fs.String("poll", "adaptive", "completion polling: adaptive, busy or event")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	bad := func(format string, a ...any) (config, bool) {
		fmt.Fprintf(stderr, "client: "+format+"\n", a...)
		fs.Usage()
		return cfg, false
	}
	var err error
	switch {
	case fs.NArg() > 0:
		return bad("unexpected arguments %q", fs.Args())
	case cfg.addr == "":
		return bad("-addr is required")
	case cfg.name == "" || len(cfg.name) > 256:
		return bad("-name: want 1..256 bytes")
	case cfg.size < 1 || cfg.size > 1<<30:
		return bad("-size %d: want 1 B..1 GiB", cfg.size)
	case cfg.rounds < 0:
		return bad("-rounds %d: want 0 or more", cfg.rounds)
	case cfg.timeout <= 0:
		return bad("-timeout %v: want a positive duration", cfg.timeout)
	case cfg.provider != rdma.ProviderAuto && cfg.provider != rdma.ProviderVerbs && cfg.provider != rdma.ProviderSoft:
		return bad("-provider %q: want auto, verbs or soft", cfg.provider)
	}
	if cfg.poll, err = rdma.ParsePollMode(*poll); err != nil {
		return bad("-poll: %v", err)
	}
	return cfg, true
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if err := session(ctx, cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "client:", err)
		return 1
	}
	return 0
}

// errShutdown is the server saying it is going away.
var errShutdown = errors.New("the server is shutting down")

// session is one visit to the server.
func session(ctx context.Context, cfg config, out io.Writer) error {
	say := func(format string, a ...any) { fmt.Fprintf(out, "client: "+format+"\n", a...) }

	conn, err := rdma.Dial(ctx, "rdma", cfg.addr, rdma.WithProvider(cfg.provider), rdma.WithPollMode(cfg.poll),
		rdma.WithMaxMessage(1024), rdma.WithRegionLimit(0))
	if err != nil {
		return err
	}
	var abandoned []*rdma.Future
	defer func() {
		// Close resolves every future; a receive we stopped waiting for
		// may still have got a message, whose buffer is ours.
		conn.Close()
		for _, f := range abandoned {
			if b := f.Buffer(); b != nil {
				b.Release()
			}
		}
	}()
	call := func(ctx context.Context, conn *rdma.Conn, req string) (string, error) {
		reply, recv, err := request(ctx, conn, req)
		if recv != nil && !recv.Resolved() {
			abandoned = append(abandoned, recv)
		}
		return reply, err
	}
	say("connected to %s from %s (provider %s, device %s)", conn.RemoteAddr(), conn.LocalAddr(), conn.Provider(), conn.Device())

	scratch, err := conn.RecvRegion(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the scratch region: %w", err)
	}
	counter, err := conn.RecvRegion(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the counter: %w", err)
	}
	say("server exposed %d bytes of scratch memory and a shared counter", scratch.Len)
	if cfg.size > scratch.Len {
		return fmt.Errorf("-size %d exceeds the server's %d-byte region", cfg.size, scratch.Len)
	}

	// One-sided: no server code runs for this.
	ticket := conn.FetchAdd(counter, 1)
	if err := ticket.Wait(ctx); err != nil {
		return fmt.Errorf("fetch-add: %w", err)
	}
	say("took ticket %d from the shared counter", ticket.Old())

	// Two-sided request and reply.
	reply, err := call(ctx, conn, "HELLO "+cfg.name)
	if err != nil {
		return err
	}
	say("HELLO -> %s", reply)

	buf, err := conn.Alloc(cfg.size)
	if err != nil {
		return err
	}
	defer buf.Release()
	area, err := scratch.Slice(0, cfg.size)
	if err != nil {
		return err
	}
	for round := 1; round <= cfg.rounds; round++ {
		payload := buf.Bytes()
		fill(payload, fmt.Sprintf("round %d from %s: the quick brown fox jumps over the lazy dog. ", round, cfg.name))
		want := sha256.Sum256(payload)
		upper := bytes.ToUpper(payload)

		start := time.Now()
		if err := conn.Write(buf, area).Wait(ctx); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		say("round %d: wrote %d bytes into the server's memory in %v", round, cfg.size, time.Since(start).Round(time.Microsecond))

		// The WRITE completed, so the bytes are in the server's memory;
		// the request that follows is how the server learns of them.
		reply, err := call(ctx, conn, fmt.Sprintf("SUM 0 %d", cfg.size))
		if err != nil {
			return err
		}
		if reply != "SUM "+hex.EncodeToString(want[:]) {
			return fmt.Errorf("round %d: server checksum %q, want %x", round, reply, want)
		}
		say("round %d: the server's SHA-256 matches ours (%x…)", round, want[:8])

		if reply, err = call(ctx, conn, fmt.Sprintf("UPPER 0 %d", cfg.size)); err != nil {
			return err
		}
		if reply != fmt.Sprintf("OK %d", cfg.size) {
			return fmt.Errorf("round %d: UPPER: %q", round, reply)
		}
		clear(payload)
		start = time.Now()
		if err := conn.Read(buf, area).Wait(ctx); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if !bytes.Equal(payload, upper) {
			return fmt.Errorf("round %d: read back %.40q…, want %.40q…", round, payload, upper)
		}
		say("round %d: read back the upper-cased bytes in %v: %.32q…", round, time.Since(start).Round(time.Microsecond), payload)
	}

	if reply, err = call(ctx, conn, "STATS"); err != nil {
		return err
	}
	say("STATS -> %s", reply)
	if reply, err = call(ctx, conn, "BYE"); err != nil {
		return err
	}
	say("BYE -> %s", reply)
	// Closing first, after the last reply, lets the server see a clean end.
	return nil
}

// request sends one request and returns the reply, and the receive for it
// in case the caller must clean it up.
func request(ctx context.Context, conn *rdma.Conn, req string) (reply string, recv *rdma.Future, err error) {
	verb, _, _ := strings.Cut(req, " ")
	msg, err := conn.Alloc(len(req))
	if err != nil {
		return "", nil, err
	}
	copy(msg.Bytes(), req)
	sent := conn.Send(msg)
	msg.Release() // the send keeps the memory until it completes
	if err := sent.Wait(ctx); err != nil {
		return "", nil, fmt.Errorf("%s: send: %w", verb, err)
	}
	recv = conn.Recv()
	if err := recv.Wait(ctx); err != nil {
		return "", recv, fmt.Errorf("%s: waiting for the reply: %w", verb, err)
	}
	b := recv.Buffer()
	if b == nil {
		return "", recv, fmt.Errorf("%s: the reply carried no message", verb)
	}
	reply = string(b.Bytes())
	b.Release()
	if strings.HasPrefix(reply, "SHUTDOWN") {
		return "", recv, fmt.Errorf("%s: %w", verb, errShutdown)
	}
	if strings.HasPrefix(reply, "ERR") {
		return "", recv, fmt.Errorf("%s: server: %q", verb, reply)
	}
	return reply, recv, nil
}

// fill repeats s over b.
func fill(b []byte, s string) {
	for i := 0; i < len(b); i += copy(b[i:], s) {
	}
}
