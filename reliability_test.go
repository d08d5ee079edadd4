package rdma_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: when the peer process is killed with SIGKILL mid-transfer, every
// pending future on this side resolves with an error in bounded time,
// nothing leaks, and the listener accepts a new connection afterwards.
func TestPeerKilled(t *testing.T) { eachProvider(t, testPeerKilled) }

func testPeerKilled(t *testing.T, opts []rdma.Option) {
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	provider := ln.Provider()
	child := testchild.Start(ctx, t, "dialer", "RDMA_TEST_ADDR="+ln.Addr().String(), "RDMA_TEST_PROVIDER="+provider)

	c, err := ln.Accept(ctx)
	require.NoError(t, err)
	var recvs []*rdma.Future
	for i := 0; i < 8; i++ {
		recvs = append(recvs, c.Recv())
	}
	// The child consumes no message: past its credits (its posted
	// receives) our sends wait in the send queue's queue.
	buf, err := c.Alloc(4096)
	require.NoError(t, err)
	var sends []*rdma.Future
	for i := 0; i < 100; i++ {
		sends = append(sends, c.Send(buf))
	}
	buf.Release() // safe: the sends hold the memory until they resolve
	child.Expect(t, "ready")
	for _, f := range recvs[:3] {
		require.NoError(t, f.Wait(ctx), "receive from the child")
		f.Buffer().Release()
	}
	pending := 0
	for _, f := range sends {
		if !f.Resolved() {
			pending++
		}
	}
	require.NotZero(t, pending, "no send pending before the kill; the test proves nothing")
	start := time.Now()
	child.Kill(t)
	bound, cancelBound := context.WithTimeout(ctx, 20*time.Second)
	defer cancelBound()
	failed := 0
	for i, f := range append(recvs[3:], sends...) {
		err := f.Wait(bound)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "a future did not resolve within 20 s of the kill")
		if err != nil {
			failed++
			// Whatever the first symptom (the socket's end, retries
			// exceeded, a flush): the peer went away, named, with the
			// completion's status kept where a completion failed (the
			// posted receives; sends past the credits never reached
			// the device). A kill is no orderly close.
			assert.ErrorIs(t, err, rdma.ErrPeerLost, "a future of the dead peer's connection")
			assert.NotErrorIs(t, err, rdma.ErrPeerClosed, "a killed peer reads as an orderly close")
			assert.Contains(t, err.Error(), c.RemoteAddr().String(), "the error names the dead peer")
			var ce *rdma.CompletionError
			if i < len(recvs)-3 {
				assert.ErrorAs(t, err, &ce, "a receive: no *CompletionError in the chain")
			}
		}
	}
	// The child keeps its default 64 receives posted and consumes none,
	// so at most 64 sends could succeed; the rest, and the 5 receives
	// the child never sent, must have failed.
	assert.GreaterOrEqual(t, failed, len(sends)-64+len(recvs)-3, "futures failed")
	assert.ErrorIs(t, c.Err(), rdma.ErrPeerLost)
	assert.NotErrorIs(t, c.Err(), rdma.ErrPeerClosed)
	t.Logf("%d pending futures failed %v after SIGKILL (%s)", failed, time.Since(start).Round(time.Millisecond), provider)
	assert.Error(t, c.Send(buf).Err(), "send on the dead connection")
	assert.NoError(t, c.Close(), "close")
	assert.Zero(t, ln.PoolStats().BuffersInUse, "pool buffers in use after close")

	// The listener still serves new peers.
	c2, s2 := rdmatest.Connect(t, ln, func(ctx context.Context, address string) (*rdma.Conn, error) {
		return rdma.Dial(ctx, "rdma", address, opts...)
	})
	b2, err := c2.Alloc(16)
	require.NoError(t, err)
	defer b2.Release()
	r := s2.Recv()
	require.NoError(t, c2.Send(b2).Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	r.Buffer().Release()
}

// Rule: Close while many goroutines post resolves every future (with an
// error wrapping net.ErrClosed if it did not complete), never panics, and
// returns every buffer to the pool.
func TestCloseUnderLoad(t *testing.T) { eachProvider(t, testCloseUnderLoad) }

func testCloseUnderLoad(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	target, _ := s.Alloc(1 << 20)
	defer target.Release()
	small, _ := c.Alloc(64)
	defer small.Release()
	region, err := s.Expose(target, rdma.RemoteWrite|rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var futures []*rdma.Future
	started := make(chan struct{}, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := c.Alloc(4096)
			if err != nil {
				return // closed already
			}
			defer b.Release()
			for i := 0; i < 200; i++ {
				var f *rdma.Future
				switch i % 3 {
				case 0:
					f = c.Write(b, region)
				case 1:
					f = c.Read(b, region)
				default:
					f = c.Send(b)
				}
				mu.Lock()
				futures = append(futures, f)
				mu.Unlock()
				if i == 10 {
					started <- struct{}{}
				}
			}
		}()
	}
	<-started
	if err := c.Close(); err != nil {
		t.Errorf("close under load: %v", err)
	}
	wg.Wait()
	for _, f := range futures {
		err := f.Wait(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatal("a future did not resolve after Close")
		}
		var ce *rdma.CompletionError
		if err != nil && !errors.Is(err, net.ErrClosed) && !errors.As(err, &ce) {
			t.Errorf("future after close: %v (want nil, net.ErrClosed or a completion error)", err)
		}
	}
	if st := c.PoolStats(); st.BuffersInUse > 1 { // small, released below
		t.Errorf("%d buffers in use after close", st.BuffersInUse)
	}
	if err := c.Send(small).Err(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("send after close: %v, want net.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// Rule: Wait with a cancelled context returns at once; the operation
// stays tracked and resolves later, and its buffer stays out of the pool
// until then.
func TestWaitCancelled(t *testing.T) { eachProvider(t, testWaitCancelled) }

func testWaitCancelled(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	r := s.Recv()
	start := time.Now()
	if err := r.Wait(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait(cancelled) = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Wait(cancelled) took %v", d)
	}
	if r.Resolved() {
		t.Fatal("receive resolved with nothing sent")
	}
	b, _ := c.Alloc(32)
	copy(b.Bytes(), "still delivered")
	before := c.PoolStats().BuffersInUse
	f := c.Send(b)
	b.Release()
	if err := f.Wait(cancelled); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if !f.Resolved() && c.PoolStats().BuffersInUse < before {
		t.Error("a released buffer went back to the pool while its send was in flight")
	}
	wait(t, f)
	wait(t, r)
	if got := string(r.Buffer().Bytes()[:15]); got != "still delivered" {
		t.Errorf("received %q", got)
	}
	r.Buffer().Release()
	select {
	case <-r.Done():
	default:
		t.Error("Done not closed after resolution")
	}
}

// Rule: RequestRegion gets memory the peer exposes for us; a peer over
// its limit refuses with ErrRegionRefused; an expired context gives up.
func TestRequestRegion(t *testing.T) { eachProvider(t, testRequestRegion) }

func testRequestRegion(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithRegionLimit(1<<20))...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := c.RequestRegion(ctx, 64<<10, rdma.RemoteWrite|rdma.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if r.Len != 64<<10 {
		t.Errorf("granted %v", r)
	}
	b, _ := c.Alloc(64 << 10)
	defer b.Release()
	for i := range b.Bytes() {
		b.Bytes()[i] = byte(i)
	}
	wait(t, c.Write(b, r))
	got, _ := c.Alloc(64 << 10)
	defer got.Release()
	wait(t, c.Read(got, r))
	if string(got.Bytes()) != string(b.Bytes()) {
		t.Error("granted region did not keep the written bytes")
	}
	_, err = c.RequestRegion(ctx, 2<<20, rdma.RemoteWrite)
	if !errors.Is(err, rdma.ErrRegionRefused) {
		t.Errorf("request over the limit: %v, want ErrRegionRefused", err)
	}
	expired, cancel2 := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel2()
	<-expired.Done()
	if _, err := c.RequestRegion(expired, 4096, rdma.RemoteRead); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("request with an expired context: %v", err)
	}
	if err := c.ReleaseRegion(ctx, r); err != nil {
		t.Error(err)
	}
	_ = s
}

// Rule: bad input at every public call is a clear error, never a panic
// or a hang: nil and foreign buffers, released buffers, out-of-range
// slices, unaligned atomics, zero and oversized lengths.
func TestBadInput(t *testing.T) { eachProvider(t, testBadInput) }

func testBadInput(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	target, _ := s.Alloc(4096)
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite|rdma.RemoteRead|rdma.RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := s.Alloc(64) // from the other side's pool
	defer foreign.Release()
	released, _ := c.Alloc(64)
	released.Release()
	big, _ := c.Alloc(8192)
	defer big.Release()
	huge, _ := c.Alloc(c.MaxMessage() + 1)
	defer huge.Release()
	zero, _ := big.Slice(0, 0)
	unaligned, _ := region.Slice(4, 8)

	for name, f := range map[string]*rdma.Future{
		"send nil":            c.Send(nil),
		"send nil *Buffer":    c.Send((*rdma.Buffer)(nil)),
		"send foreign":        c.Send(foreign),
		"send released":       c.Send(released),
		"send too large":      c.Send(huge),
		"write past region":   c.Write(big, region),
		"write zero":          c.Write(zero, region),
		"read past region":    c.Read(big, region),
		"read nil":            c.Read(nil, region),
		"cas unaligned":       c.CompareAndSwap(unaligned, 0, 1),
		"faa short region":    c.FetchAdd(rdma.RemoteRegion{Addr: region.Addr, Len: 4, RKey: region.RKey}, 1),
		"write with imm nil":  c.WriteWithImm(nil, region, 1),
		"send with imm freed": c.SendWithImm(released, 1),
	} {
		if !f.Resolved() || !errors.Is(f.Err(), rdma.ErrInvalid) && !strings.Contains(f.Err().Error(), "released") {
			t.Errorf("%s: %v (resolved %v), want an immediate ErrInvalid", name, f.Err(), f.Resolved())
		}
	}
	if _, err := big.Slice(8000, 1000); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("out-of-range buffer slice: %v", err)
	}
	if _, err := region.Slice(4000, 200); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("out-of-range region slice: %v", err)
	}
	if _, err := c.Alloc(0); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Alloc(0): %v", err)
	}
	if _, err := c.Alloc(-1); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Alloc(-1): %v", err)
	}
	if _, err := c.Expose(big, 0); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Expose with no rights: %v", err)
	}
	if _, err := c.Expose(nil, rdma.RemoteRead); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Expose(nil): %v", err)
	}
	if err := c.Revoke(context.Background(), rdma.RemoteRegion{RKey: 12345}); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Revoke of an unknown region: %v", err)
	}
	if err := released.Release(); err == nil {
		t.Error("second Release succeeded")
	}
	if released.Bytes() != nil {
		t.Error("Bytes of a released buffer is not nil")
	}
	var rr rdma.RemoteRegion
	if err := rr.UnmarshalBinary([]byte{1, 2, 3}); err == nil {
		t.Error("UnmarshalBinary of 3 bytes succeeded")
	}
	if _, err := rdma.Dial(context.Background(), "tcp", "127.0.0.1:1"); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("Dial over tcp: %v", err)
	}
	if _, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider("nope")); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("unknown provider: %v", err)
	}
	if _, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithQueueDepth(0, 1)); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("zero queue depth: %v", err)
	}
	if _, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithPollSpin(0)); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("zero poll spin: %v", err)
	}
	// The connection survived all of it.
	wait(t, c.Write(foreignFree(t, c), region))
}

// foreignFree is a small buffer of c's own, released when the test ends.
func foreignFree(t *testing.T, c *rdma.Conn) *rdma.Buffer {
	b, err := c.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Release() })
	return b
}

// TestMessagesBeforeClose: what the peer sent before it closed is
// received, even when the close reaches this side before the poller has
// taken the message's completion: Recv on the failed connection still
// returns what arrived, then the error.
func TestMessagesBeforeClose(t *testing.T) { eachProvider(t, testMessagesBeforeClose) }

func testMessagesBeforeClose(t *testing.T, opts []rdma.Option) {
	rounds := 100
	if strings.HasSuffix(t.Name(), "/verbs") {
		rounds = 5 // a connection takes most of a second under TCG
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range rounds {
		c, s := rdmatest.Pair(t, append(opts, rdma.WithPollMode(rdma.PollEvent))...)
		b, err := c.Alloc(8)
		if err != nil {
			t.Fatal(err)
		}
		wait(t, c.Send(b))
		b.Release()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		f := s.Recv()
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("round %d: the message sent before Close: %v", i, err)
		}
		f.Buffer().Release()
		if err := s.Recv().Wait(ctx); !errors.Is(err, rdma.ErrPeerClosed) {
			t.Fatalf("round %d: Recv after the message: %v, want ErrPeerClosed", i, err)
		}
	}
}

// TestPollerStopped: when the poller of a connection stops, nothing will
// complete its receives any more: a pending Recv fails at once, and so
// does a new one.
func TestPollerStopped(t *testing.T) {
	_, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithPollMode(rdma.PollEvent))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	broke := errors.New("poller broke")
	f := s.Recv()
	rdma.StopPoller(s, broke)
	if err := f.Wait(ctx); !errors.Is(err, broke) {
		t.Errorf("pending Recv: %v, want %v", err, broke)
	}
	if err := s.Recv().Wait(ctx); !errors.Is(err, broke) {
		t.Errorf("new Recv: %v, want %v", err, broke)
	}
}
