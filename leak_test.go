package rdma_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
	"github.com/go-rdma/rdma/rdmatest"
)

// gcUntil runs the GC until ch is closed, for at most 10 s: the safety
// net runs only after a collection finds a handle unreachable.
func gcUntil(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		runtime.GC()
		select {
		case <-ch:
			return
		case <-deadline.C:
			t.Fatalf("%s: not after 10 s of garbage collections", what)
		case <-tick.C:
		}
	}
}

// gcUntilTrue is gcUntil for a condition.
func gcUntilTrue(t *testing.T, cond func() bool, what string) {
	t.Helper()
	done := make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for !cond() {
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
		close(done)
	}()
	gcUntil(t, done, what)
}

// site is the file:line of the line after the caller's: the statement
// that makes a buffer the test then loses.
func site() string {
	_, file, line, _ := runtime.Caller(1)
	return fmt.Sprintf("%s:%d", file, line+1)
}

// loseBuffers sends an Alloc'd buffer from c to s and receives it, then
// drops both handles without Release. It returns where each was made.
//
//go:noinline
func loseBuffers(t *testing.T, c, s *rdma.Conn) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	allocSite := site()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	copy(b.Bytes(), "lost")
	r := s.Recv()
	require.NoError(t, c.Send(b).Wait(ctx))
	require.NoError(t, r.Wait(ctx))
	recvSite := site()
	got := r.Buffer().Bytes()
	require.Equal(t, "lost", string(got[:4]))
	return []string{allocSite, recvSite}
}

// Rule: a Buffer dropped without Release (one Alloc'd, one received) does
// not keep the device open: once every Conn and Listener is closed and
// the handles are garbage collected, the pools drain, the PD and device
// context close and no goroutine stays.
func TestDroppedBufferClosesDevice(t *testing.T) {
	eachProvider(t, testDroppedBufferClosesDevice)
}

func testDroppedBufferClosesDevice(t *testing.T, opts []rdma.Option) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	mark := leak.Now()
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan *rdma.Conn, 1)
	go func() {
		s, err := ln.Accept(ctx)
		assert.NoError(t, err)
		accepted <- s
	}()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	drained := map[string]<-chan struct{}{"dialer's pool": rdma.PoolDrained(c), "listener's pool": rdma.PoolDrained(s)}

	sites := loseBuffers(t, c, s)

	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, ln.Close())
	for what, ch := range drained {
		gcUntil(t, ch, what+" drained")
	}

	// The leak check saw both, collected, where they were made; they
	// were lost on purpose, so the run's final check must not count them.
	leaks := leak.Take(mark)
	if !leak.Enabled() {
		return // a -test.bench run: nothing is tracked
	}
	require.Len(t, leaks, 2)
	var got []string
	for _, l := range leaks {
		assert.True(t, l.Collected, "leak at %s not reported by the safety net", l.Site)
		got = append(got, l.Site)
	}
	assert.ElementsMatch(t, sites, got)
}

// loseOne allocates a buffer and loses it; it returns where.
//
//go:noinline
func loseOne(t *testing.T, c *rdma.Conn) string {
	at := site()
	_, err := c.Alloc(64)
	require.NoError(t, err)
	return at
}

// releaseAndDrop allocates n bytes on c, releases them and drops the
// handle; it returns the memory's address.
//
//go:noinline
func releaseAndDrop(t *testing.T, c *rdma.Conn, n int) uint64 {
	b, err := c.Alloc(n)
	require.NoError(t, err)
	addr := rdma.BufferAddr(b)
	require.NoError(t, b.Release())
	return addr
}

// receiveReleaseAndDrop sends from c to s, releases the received buffer
// and drops its future; it returns the buffer's capacity.
//
//go:noinline
func receiveReleaseAndDrop(t *testing.T, c, s *rdma.Conn) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	r := s.Recv()
	require.NoError(t, c.Send(b).Wait(ctx))
	require.NoError(t, b.Release())
	require.NoError(t, r.Wait(ctx))
	rb := r.Buffer()
	n := rb.Cap()
	require.NoError(t, rb.Release())
	return n
}

// Rule: releasing a Buffer and then dropping the handle never releases
// it twice: its memory, handed to a new Alloc (or to a receive), stays
// with its new owner after the old handle is collected.
func TestReleaseThenDropNoDoubleRelease(t *testing.T) {
	mark := leak.Now()
	defer func() { leak.Take(mark) }() // the sentinels, lost on purpose
	c, s := rdmatest.Pair(t)
	// A side's own buffers: what its pool has in use less the receives
	// its shared receive queue has posted, which refills change at any
	// time (the first ones, for the new connection, may still be on
	// their way when Pair returns).
	own := func(x *rdma.Conn) int {
		for {
			posted := rdma.SharedRecvStats(x).Posted
			n := x.PoolStats().BuffersInUse
			if rdma.SharedRecvStats(x).Posted == posted {
				return n - int(posted)
			}
		}
	}
	inUse := func() int { return own(c) }
	base := inUse()

	// An Alloc'd buffer, released and dropped, whose memory the next
	// Alloc gets.
	addr := releaseAndDrop(t, c, 64)
	next, err := c.Alloc(64)
	require.NoError(t, err)
	require.Equal(t, addr, rdma.BufferAddr(next), "the pool did not reuse the released buffer; the test proves nothing")

	// A received buffer, released and dropped, whose memory the next
	// Alloc of its size class gets (or a receive the connection posts).
	n := receiveReleaseAndDrop(t, c, s)
	rbase := own(s)
	reuse, err := s.Alloc(n)
	require.NoError(t, err)

	// Let the GC find the dropped handles: a sentinel lost after them is
	// collected (twice, to give any wrongly armed cleanup time to run).
	for i := 0; i < 2; i++ {
		before := inUse()
		loseOne(t, c)
		gcUntilTrue(t, func() bool { return inUse() == before }, "sentinel collected")
	}

	assert.Equal(t, base+1, inUse(), "buffers in use on the dialer: next only")
	assert.NotNil(t, next.Bytes(), "next lost its memory to the old handle's cleanup")
	assert.NoError(t, next.SetLen(8))
	assert.Equal(t, rbase+1, own(s), "the receiver's buffers: reuse")
	assert.NotNil(t, reuse.Bytes(), "the receiver's new buffer lost its memory")
	require.NoError(t, next.Release())
	require.NoError(t, reuse.Release())
	assert.Equal(t, base, inUse())
	assert.Equal(t, rbase, own(s))
}

// leakChildEnv makes TestLeakCheckNamesSite, in a child process, lose
// buffers and end, so that the package's leak check fails the run.
const leakChildEnv = "RDMA_TEST_LEAK_CHILD"

// Rule: a test that forgets a Release fails the package's test run (exit
// 99), and the report names the file:line that made each lost buffer,
// Alloc'd or received.
func TestLeakCheckNamesSite(t *testing.T) {
	if os.Getenv(leakChildEnv) == "1" {
		c, s := rdmatest.Pair(t)
		sites := loseBuffers(t, c, s)
		fmt.Printf("lost-at %s\n", strings.Join(sites, " "))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLeakCheckNamesSite$", "-test.count=1")
	cmd.Env = append(os.Environ(), leakChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child passed; output:\n%s", out)
	assert.Equal(t, leak.ExitCode, exit.ExitCode(), "output:\n%s", out)
	var sites []string
	for _, line := range strings.Split(string(out), "\n") {
		if f, ok := strings.CutPrefix(line, "lost-at "); ok {
			sites = strings.Fields(f)
		}
	}
	require.Len(t, sites, 2, "the child did not say where it lost its buffers; output:\n%s", out)
	for _, at := range sites {
		assert.Contains(t, string(out), "allocated at "+at+"\n", "leak report does not name %s", at)
	}
	assert.Contains(t, string(out), "2 rdma.Buffer handle(s) never released")
}
