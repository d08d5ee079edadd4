package stream_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/go-rdma/rdma/stream"
)

// streamWriterChild is the child of TestStreamPeerKilled: it dials
// $RDMA_TEST_ADDR, writes 256 KiB, says "ready", then writes until it is
// killed (it is blocked by flow control long before).
func streamWriterChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := []rdma.Option{rdma.WithProvider(os.Getenv("RDMA_TEST_PROVIDER"))}
	switch os.Getenv("RDMA_TEST_SETUP") {
	case "soft-header":
		stream.SetHeaderMode(true)
	case "verbs-rdma_cm":
		opts = append(opts, rdma.WithRDMACM())
	}
	c, err := stream.Dial(ctx, "rdma", os.Getenv("RDMA_TEST_ADDR"), opts...)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	buf := bytes.Repeat([]byte("0123456789abcdef"), 16<<10)
	if _, err := c.Write(buf); err != nil {
		fmt.Println("write:", err)
		return 1
	}
	fmt.Println("ready")
	for ctx.Err() == nil {
		if _, err := c.Write(buf); err != nil {
			fmt.Println("write:", err)
			return 1
		}
	}
	return 1
}

// TestStreamPeerKilled: the peer process is SIGKILLed in the middle of a
// stream. Read fails (not io.EOF, no hang) once the data that arrived is
// read, a Write blocked by flow control fails, and so does a new Write.
func TestStreamPeerKilled(t *testing.T) { eachProvider(t, testStreamPeerKilled) }

func testStreamPeerKilled(t *testing.T, opts []rdma.Option) {
	l, err := stream.Listen("rdma", listenAddr(t), opts...)
	require.NoError(t, err)
	ln := l.(*stream.Listener)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	setup := t.Name()[strings.LastIndexByte(t.Name(), '/')+1:]
	child := testchild.Start(ctx, t, "stream-writer", "RDMA_TEST_ADDR="+ln.Addr().String(),
		"RDMA_TEST_PROVIDER="+ln.RDMAListener().Provider(), "RDMA_TEST_SETUP="+setup)
	c, err := ln.AcceptContext(ctx)
	require.NoError(t, err)
	defer c.Close()
	child.Expect(t, "ready")
	// The stream flows.
	_, err = io.ReadFull(c, make([]byte, 100<<10))
	require.NoError(t, err)
	// A writer the child never reads from: it blocks once the window is
	// used up.
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20))
		wrote <- err
	}()
	child.Kill(t)
	start := time.Now()
	// Bound the test, not the stream: a hang is a failure.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 64<<10)
	var rerr error
	for rerr == nil {
		_, rerr = c.Read(buf)
	}
	require.NotErrorIs(t, rerr, io.EOF, "Read after the peer was killed: want a reset")
	rc := c.(*stream.Conn).RDMAConn()
	require.NotErrorIs(t, rerr, os.ErrDeadlineExceeded, "Read after the peer was killed: want a reset; the connection's error: %v; stream: %s", rc.Err(), stream.DebugState(c.(*stream.Conn)))
	assert.ErrorIs(t, rerr, syscall.ECONNRESET, "Read error")
	if rc.Credited() {
		// go-rdma's handshake: the control channel's end tells a killed
		// peer from a close. An rdma_cm disconnect cannot (the kernel
		// disconnects a dead process's connections as a close does),
		// so there the stream's reset (no fin came) is what says it.
		assert.ErrorIs(t, rerr, rdma.ErrPeerLost, "Read error: the reset's cause")
		assert.NotErrorIs(t, rerr, rdma.ErrPeerClosed, "Read error: a killed peer is no orderly close")
	}
	var oe *net.OpError
	if assert.ErrorAs(t, rerr, &oe, "Read error is not a *net.OpError") {
		assert.Equal(t, "read", oe.Op, "Read error's Op")
	}
	werr := <-wrote
	require.Error(t, werr, "blocked Write after the peer was killed")
	require.NotErrorIs(t, werr, os.ErrDeadlineExceeded, "blocked Write after the peer was killed")
	_, err = c.Write([]byte("x"))
	require.Error(t, err, "Write after the peer was killed succeeded")
	t.Logf("read: %v; write: %v; %v after SIGKILL", rerr, werr, time.Since(start).Round(time.Millisecond))
}

// TestStreamCloseUnblocks: Close from another goroutine unblocks a Read
// waiting for data and a Write waiting for credits, with errors wrapping
// net.ErrClosed; the peer still reads what was written, then io.EOF.
func TestStreamCloseUnblocks(t *testing.T) { eachProvider(t, testStreamCloseUnblocks) }

func testStreamCloseUnblocks(t *testing.T, opts []rdma.Option) {
	c, s := streamPair(t, opts...)
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		readErr <- err
	}()
	type res struct {
		n   int
		err error
	}
	wrote := make(chan res, 1)
	payload := make([]byte, 32<<20)
	for i := range payload {
		payload[i] = byte(i / 4096)
	}
	go func() {
		n, err := c.Write(payload)
		wrote <- res{n, err}
	}()
	// The writer blocks for credits (in header mode, for the peer's
	// count of messages taken) once the peer's first bytes are in: the
	// ring is far smaller than the payload, and the peer reads no more.
	// Whatever Write reports written must still reach the peer.
	first := make([]byte, 1)
	if _, err := io.ReadFull(s, first); err != nil {
		t.Fatal(err)
	}
	require.Eventually(t, func() bool { return stream.WriteBlocked(c) }, 20*time.Second, time.Millisecond, "the writer never blocked")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	bound := time.After(20 * time.Second)
	select {
	case err := <-readErr:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked Read after Close: %v", err)
		}
	case <-bound:
		t.Fatal("Close did not unblock Read")
	}
	var w res
	select {
	case w = <-wrote:
		if !errors.Is(w.err, net.ErrClosed) || w.n >= len(payload) {
			t.Errorf("blocked Write after Close: %d, %v", w.n, w.err)
		}
	case <-bound:
		t.Fatal("Close did not unblock Write")
	}
	// The peer reads exactly what Write reported, then io.EOF.
	rest, err := io.ReadAll(s)
	if err != nil {
		t.Fatalf("peer: %v after %d bytes", err, len(rest))
	}
	if got := append(first, rest...); !bytes.Equal(got, payload[:w.n]) {
		t.Errorf("peer read %d bytes, Write reported %d", len(got), w.n)
	}
	// Later calls fail with net.ErrClosed, and Close is idempotent.
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.SetDeadline(time.Now()); err != nil {
		t.Errorf("SetDeadline after Close: %v", err)
	}
}

// TestStreamDeadlines: a past deadline fails at once with a timeout that
// wraps os.ErrDeadlineExceeded, in a *net.OpError; a deadline stops a
// blocked call; clearing it makes the conn usable again; a deadline
// reached by a Write blocked on a slow reader returns n < len(p) and
// those n bytes arrive.
func TestStreamDeadlines(t *testing.T) { eachProvider(t, testStreamDeadlines) }

func testStreamDeadlines(t *testing.T, opts []rdma.Option) {
	c, s := streamPair(t, opts...)
	c.SetDeadline(time.Now().Add(-time.Second))
	for name, f := range map[string]func() error{
		"read":  func() error { _, err := c.Read(make([]byte, 1)); return err },
		"write": func() error { _, err := c.Write([]byte("x")); return err },
	} {
		err := f()
		var ne net.Error
		var oe *net.OpError
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() || !errors.As(err, &oe) || oe.Op != name {
			t.Errorf("%s with a past deadline: %v", name, err)
		}
	}
	c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "hello" {
		t.Fatalf("%q, %v", got, err)
	}

	// Back-pressure: the reader does not read; the writer stops after
	// at most the window, and its deadline ends the Write.
	big := make([]byte, 16<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	wait := 300 * time.Millisecond
	if inVM() {
		wait = 3 * time.Second
	}
	c.SetWriteDeadline(time.Now().Add(wait))
	n, err := c.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write to a reader that does not read: %d, %v", n, err)
	}
	window := stream.DefaultRingSize // the peer's ring
	if n == 0 || n > window {
		t.Errorf("Write took %d bytes before blocking, want 1..%d (the peer's ring)", n, window)
	}
	// Both ends share one engine here, so its pool holds each end's ring,
	// staging buffer and headers (at most a KiB), and the shared receive
	// queue: the credits of both connections (32 receives each) and its
	// headroom (16), and in header mode up to a window (32) of messages
	// not taken yet.
	if st := s.RDMAConn().PoolStats(); st.BytesInUse > int64(4*window+2*1024+112*c.RDMAConn().MaxMessage()) {
		t.Errorf("the engine holds %d bytes of registered memory, more than two rings, two staging buffers, headers and 112 receives", st.BytesInUse)
	}
	c.SetWriteDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(big[n:])
		done <- err
	}()
	all := make([]byte, len(big))
	if _, err := io.ReadFull(s, all); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(all, big) {
		t.Fatal("bytes differ after a timed-out Write")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStreamManyConns: 1,000 connections opened, used and closed in a
// loop leave no goroutines, no file descriptors and no pool buffers.
func TestStreamManyConns(t *testing.T) { eachTCPSetup(t, testStreamManyConns) }

func testStreamManyConns(t *testing.T, opts []rdma.Option) {
	// In the emulated VM each verbs connection takes over a second to
	// set up (it opens the device), so fewer there.
	n := 1000
	if inVM() {
		n = 10
	}
	if testing.Short() {
		n = 100
	}
	// Warm up what lives for the process (the soft provider's listener
	// comes and goes with its users; caches of device lists stay).
	warm, ws := rdmatest.StreamPair(t, opts...)
	warm.Close()
	ws.Close()
	fds := countFDs(t)
	ignore := goleak.IgnoreCurrent()

	ln, err := stream.Listen("rdma", "127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	sl := ln.(*stream.Listener)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	accepted := make(chan net.Conn)
	go func() {
		for {
			c, err := sl.AcceptContext(ctx)
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	msg := []byte("ping")
	for i := 0; i < n; i++ {
		c, err := stream.Dial(ctx, "rdma", ln.Addr().String(), opts...)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		s := <-accepted
		if s == nil {
			t.Fatalf("accept %d failed", i)
		}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4)
		if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("conn %d: %q, %v", i, got, err)
		}
		// Alternate who closes first.
		if i%2 == 0 {
			c.Close()
			s.Close()
		} else {
			s.Close()
			c.Close()
		}
		if st := c.(*stream.Conn).RDMAConn().PoolStats(); st.BuffersInUse != 0 {
			t.Fatalf("conn %d: %d buffers of the dialer's pool in use after close", i, st.BuffersInUse)
		}
	}
	if st := sl.RDMAListener().PoolStats(); st.BuffersInUse != 0 {
		t.Errorf("%d buffers of the listener's pool in use after %d conns", st.BuffersInUse, n)
	}
	ln.Close()
	<-accepted
	if err := goleak.Find(ignore); err != nil {
		t.Errorf("after %d conns: %v", n, err)
	}
	if after := countFDs(t); after > fds {
		t.Errorf("%d fds open before %d conns, %d after", fds, n, after)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	// The soft provider's listener, and the verbs device, close when
	// the last user goes; goroutines that close them may still run.
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestStreamGarbage: peers that speak no go-rdma stream get clean errors
// on both sides, and the listener goes on serving.
func TestStreamGarbage(t *testing.T) { eachTCPSetup(t, testStreamGarbage) }

func testStreamGarbage(t *testing.T, opts []rdma.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := stream.Listen("rdma", "127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sl := ln.(*stream.Listener)

	// 1. A raw TCP client sends junk to the listener: it is refused and
	// disconnected; Accept does not return it.
	tc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(20 * time.Second))
	tc.Write(bytes.Repeat([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 8))
	answer, err := io.ReadAll(tc)
	tc.Close()
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("junk client: %v after %q", err, answer)
	}
	if len(answer) == 0 || answer[0] != 1 || !bytes.Contains(answer, []byte("not a go-rdma")) {
		t.Errorf("junk client got %q, want a refusal", answer)
	}

	// 2. A raw TCP server answers junk to Dial.
	junk, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	go func() {
		c, err := junk.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" + strings.Repeat("x", 200)))
		io.Copy(io.Discard, c)
	}()
	_, err = stream.Dial(ctx, "rdma", junk.Addr().String(), opts...)
	var oe *net.OpError
	if !errors.Is(err, rdma.ErrNotRDMA) || !errors.As(err, &oe) || oe.Op != "dial" {
		t.Errorf("Dial to a junk server: %v", err)
	}

	// 3. A go-rdma peer of the plain async API is refused at its dial,
	// with an error that names both protocols; so is a stream dial to a
	// plain listener.
	_, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	require.ErrorIs(t, err, rdma.ErrRefused)
	// The listener's words, quoted by the dialer.
	assert.Contains(t, err.Error(), strconv.Quote(`the dialer speaks the plain async API (no protocol), this listener protocol "`+stream.Protocol+`"`))
	plain, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer plain.Close()
	_, err = stream.Dial(ctx, "rdma", plain.Addr().String(), opts...)
	require.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), strconv.Quote(`the dialer speaks protocol "`+stream.Protocol+`", this listener the plain async API (no protocol)`))
	var oe2 *net.OpError
	require.ErrorAs(t, err, &oe2)
	assert.Equal(t, "dial", oe2.Op)

	// 4. A peer that claims the stream's protocol but sends a message
	// that is no stream hello: the stream's Read fails with a protocol
	// error, and the peer's connection ends at once, telling it why.
	acc := make(chan net.Conn, 1)
	go func() { c, _ := sl.AcceptContext(ctx); acc <- c }()
	raw, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), append(opts, rdma.WithProtocol(stream.Protocol))...)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	defer s.Close()
	b, _ := raw.Alloc(60)
	copy(b.Bytes(), "this is not a stream")
	err = raw.Send(b).Wait(ctx)
	b.Release()
	require.NoError(t, err)
	s.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = s.Read(make([]byte, 100))
	if !errors.Is(err, stream.ErrProtocol) || !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("stream Read from a non-stream peer: %v", err)
	}
	for {
		f := raw.Recv()
		if err := f.Wait(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("the non-stream peer's connection did not end")
			}
			break
		}
		f.Buffer().Release() // the stream's hello
	}
	require.ErrorIs(t, raw.Err(), rdma.ErrPeerClosed)
	assert.Contains(t, raw.Err().Error(), "stream protocol error", "the abort carries the reason")

	// 5. The listener still serves streams.
	go func() { c, _ := sl.AcceptContext(ctx); acc <- c }()
	c2, err := stream.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s2 := <-acc
	if s2 == nil {
		t.Fatal("accept failed")
	}
	defer s2.Close()
	c2.Write([]byte("ok"))
	got := make([]byte, 2)
	if _, err := io.ReadFull(s2, got); err != nil || string(got) != "ok" {
		t.Fatalf("%q, %v", got, err)
	}
}

// TestStreamListenerClose: Close unblocks Accept with an error wrapping
// net.ErrClosed; the API refuses other networks.
func TestStreamListenerClose(t *testing.T) {
	ln, err := stream.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not unblock Accept")
	}
	if _, err := stream.Listen("tcp", "127.0.0.1:0"); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Listen over tcp: %v", err)
	}
	if _, err := stream.Dial(context.Background(), "udp", "127.0.0.1:1"); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Dial over udp: %v", err)
	}
	if _, err := (&stream.Dialer{}).DialContext(context.Background(), "unix", "/x"); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Dialer over unix: %v", err)
	}
	if _, err := stream.Listen("rdma", "127.0.0.1:0", rdma.WithQueueDepth(64, 4)); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Listen with 4 receives: %v", err)
	}
	// The dialer's depths are checked once connected (they are the
	// rdma.Conn's); the listener goes on.
	ln, err = stream.Listen("rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	if _, err := stream.Dial(context.Background(), "rdma", ln.Addr().String(), rdma.WithQueueDepth(4, 64)); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Dial with a send queue of 4: %v", err)
	}
}
