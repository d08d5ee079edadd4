package rdma_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// These tests play careless and hostile peers against the public API
// (and, where a peer must break the protocol, raw control frames).

// failedWith waits (bounded) for f to resolve and requires its error to
// match target.
func failedWith(t *testing.T, f *rdma.Future, target error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := f.Wait(ctx)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the future did not resolve")
	require.ErrorIs(t, err, target)
	return err
}

func requestFrame(id uint32, size uint64) []byte {
	p := binary.BigEndian.AppendUint32(nil, id)
	p = binary.BigEndian.AppendUint64(p, size)
	p = binary.BigEndian.AppendUint32(p, uint32(rdma.RemoteRead))
	return binary.BigEndian.AppendUint32(p, 0)
}

// Rule: a peer that floods region requests costs a bounded number of
// goroutines, and is cut off once it has more in flight than the
// protocol allows.
func TestRequestFlood(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	rdma.Deafen(c) // it never hears the answers
	base := runtime.NumGoroutine()
	r := s.Recv()
	most := 0
	for i := range 50000 {
		if r.Resolved() {
			break
		}
		if rdma.SendControl(c, rdma.CtrlRequest, requestFrame(uint32(i+1), 1)) != nil {
			break
		}
		if i%100 == 0 {
			most = max(most, runtime.NumGoroutine())
		}
	}
	err := failedWith(t, r, rdma.ErrProtocol)
	assert.Contains(t, err.Error(), c.LocalAddr().String(), "the error names the peer")
	assert.LessOrEqual(t, most, base+4, "goroutines while the peer floods requests (%d before)", base)
}

// Rule: many goroutines asking for regions at once, past the peer's
// limit, all get an answer (a region or a refusal), nothing is cut off,
// and the peer's accounting returns to zero (-race checks the
// accounting's locking).
func TestRequestRegionConcurrent(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithRegionLimit(8<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted, refused := 0, 0
	for range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				r, err := c.RequestRegion(ctx, 1<<20, rdma.RemoteWrite)
				if errors.Is(err, rdma.ErrRegionRefused) {
					mu.Lock()
					refused++
					mu.Unlock()
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				granted++
				mu.Unlock()
				assert.NoError(t, c.ReleaseRegion(ctx, r))
			}
		}()
	}
	wg.Wait()
	t.Logf("%d granted, %d refused", granted, refused)
	assert.Positive(t, granted)
	require.Eventually(t, func() bool { b, n := rdma.Granted(s); return b == 0 && n == 0 }, 10*time.Second, time.Millisecond)
	b, err := c.Alloc(8)
	require.NoError(t, err)
	defer b.Release()
	r := s.Recv()
	wait(t, c.Send(b))
	wait(t, r)
	r.Buffer().Release()
}

// Rule: a RequestRegion whose context ends as the grant arrives loses
// nothing: the grant goes back to the peer, whose limit recovers.
func TestRequestRegionAbandoned(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft), rdma.WithRegionLimit(8<<20))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gaveUp := 0
	for range 200 {
		short, stop := context.WithTimeout(ctx, time.Duration(rand.IntN(400))*time.Microsecond)
		r, err := c.RequestRegion(short, 1<<20, rdma.RemoteWrite)
		stop()
		if errors.Is(err, rdma.ErrRegionRefused) {
			continue // grants given up on are on their way back: the limit is full for now
		}
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			gaveUp++
			continue
		}
		require.NoError(t, c.ReleaseRegion(ctx, r))
	}
	t.Logf("%d of 200 requests gave up", gaveUp)
	// The peer answers requests in order: once a last one is answered,
	// none given up on is still on its way to be granted.
	var last rdma.RemoteRegion
	require.Eventually(t, func() bool {
		r, err := c.RequestRegion(ctx, 1, rdma.RemoteWrite)
		if errors.Is(err, rdma.ErrRegionRefused) {
			return false // the limit is still full of grants on their way back
		}
		require.NoError(t, err)
		last = r
		return true
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, c.ReleaseRegion(ctx, last))
	require.Eventually(t, func() bool { b, n := rdma.Granted(s); return b == 0 && n == 0 }, 10*time.Second, time.Millisecond,
		"grants of abandoned requests were not handed back")
	r, err := c.RequestRegion(ctx, 8<<20, rdma.RemoteWrite)
	require.NoError(t, err, "the whole limit is free again")
	require.NoError(t, c.ReleaseRegion(ctx, r))
}

// Rule: regions the application does not take never stop the control
// channel. SendRegion waits for room; region requests are still
// answered and the peer's close is still noticed. A peer that sends
// past the bound is cut off, not waited for.
func TestRegionQueue(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(64)
	require.NoError(t, err)
	defer b.Release()
	region, err := c.Expose(b, rdma.RemoteRead)
	require.NoError(t, err)
	for range 16 {
		require.NoError(t, c.SendRegion(ctx, region))
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	require.ErrorIs(t, c.SendRegion(short, region), context.DeadlineExceeded, "the 17th region waits for room")
	stop()
	// The control channel still serves.
	g, err := s.RequestRegion(ctx, 4096, rdma.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, s.ReleaseRegion(ctx, g))
	// Taking one makes room for one.
	got, err := s.RecvRegion(ctx)
	require.NoError(t, err)
	require.Equal(t, region, got)
	require.NoError(t, c.SendRegion(ctx, region))
	// The peer's Close is noticed by a pending Recv.
	r := s.Recv()
	require.NoError(t, c.Close())
	failedWith(t, r, rdma.ErrPeerClosed)

	// A hostile peer that ignores the bound is cut off at once.
	c2, s2 := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	r2 := s2.Recv()
	for range 20 {
		rdma.SendControl(c2, rdma.CtrlRegion, make([]byte, 20))
	}
	failedWith(t, r2, rdma.ErrProtocol)
}

// Rule: a peer can hand back only regions granted to it through
// RequestRegion; memory this side exposed stays exposed until its own
// Revoke.
func TestPeerCannotRevokeExpose(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := s.Alloc(4096)
	require.NoError(t, err)
	defer b.Release()
	region, err := s.Expose(b, rdma.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, rdma.SendControl(c, rdma.CtrlFree, binary.BigEndian.AppendUint32(nil, region.RKey)))
	// A round trip on the control channel: the release was handled.
	g, err := c.RequestRegion(ctx, 64, rdma.RemoteRead)
	require.NoError(t, err)
	require.NoError(t, c.ReleaseRegion(ctx, g))
	require.NoError(t, s.Revoke(ctx, region), "the owner's own revoke")
}

// Rule: a peer that closes, or dies, fails every operation with an
// error that matches ErrPeerClosed and names the peer, whatever the
// first symptom; an operation that completed reports success.
func TestPeerCloseErrors(t *testing.T) { eachProvider(t, testPeerCloseErrors) }

func testPeerCloseErrors(t *testing.T, opts []rdma.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // rxe under TCG: tens of seconds
	defer cancel()
	for round := range 10 {
		c, s := rdmatest.Pair(t, opts...)
		b, err := s.Alloc(1 << 20)
		require.NoError(t, err)
		region, err := s.Expose(b, rdma.RemoteWrite)
		require.NoError(t, err)
		require.NoError(t, s.SendRegion(ctx, region))
		remote, err := c.RecvRegion(ctx)
		require.NoError(t, err)
		src, err := c.Alloc(16 << 10)
		require.NoError(t, err)
		var fs []*rdma.Future
		for i := range 80 {
			dst, err := remote.Slice(i*(8<<10), 8<<10)
			require.NoError(t, err)
			sl, _ := src.Slice(0, 8<<10)
			fs = append(fs, c.Write(sl, dst))
		}
		recv := c.Recv()
		require.NoError(t, s.Close())
		fs = append(fs, recv)
		for _, f := range fs {
			err := f.Wait(ctx)
			if f == recv || err != nil {
				require.ErrorIs(t, err, rdma.ErrPeerClosed, "round %d", round)
				assert.Contains(t, err.Error(), s.LocalAddr().String(), "the error names the peer")
			}
		}
		require.ErrorIs(t, c.Write(src, remote).Err(), rdma.ErrPeerClosed)
		require.NoError(t, src.Release())
		require.NoError(t, b.Release())
	}
}

// Rule: a graceful Close keeps its promise to both sides. A message the
// receiver took before it closed was delivered: the sender's future
// resolves without an error.
func TestLastMessageBeforeClose(t *testing.T) { eachProvider(t, testLastMessageBeforeClose) }

func testLastMessageBeforeClose(t *testing.T, opts []rdma.Option) {
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rounds := 100
	if ln.Provider() == rdma.ProviderVerbs {
		rounds = 30 // each round sets a connection up on an emulated machine
	}
	for round := range rounds {
		acc := make(chan *rdma.Conn, 1)
		go func() { s, _ := ln.Accept(ctx); acc <- s }()
		c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
		require.NoError(t, err)
		s := <-acc
		require.NotNil(t, s)
		b, err := c.Alloc(64)
		require.NoError(t, err)
		r := s.Recv()
		sent := c.Send(b)
		require.NoError(t, r.Wait(ctx))
		r.Buffer().Release()
		require.NoError(t, s.Close())
		require.NoError(t, sent.Wait(ctx), "round %d: the message was delivered", round)
		require.NoError(t, b.Release())
		require.NoError(t, c.Close())
	}
}

// Rule: a granted region lives no longer than its lifetime, set per
// request or per Listen/Dial; then it is revoked in order, the grantee's
// accesses fail with ErrRegionRevoked and the connection stays up.
func TestRegionLifetime(t *testing.T) { eachProvider(t, testRegionLifetime) }

func testRegionLifetime(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, append(opts, rdma.WithRegionLifetime(time.Hour))...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := c.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	r, err := c.RequestRegion(ctx, 4096, rdma.RemoteWrite, rdma.RegionLifetime(100*time.Millisecond))
	require.NoError(t, err)
	wait(t, c.Write(src, r))
	require.Eventually(t, func() bool {
		return errors.Is(c.Write(src, r).Wait(ctx), rdma.ErrRegionRevoked)
	}, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { b, n := rdma.Granted(s); return b == 0 && n == 0 }, 10*time.Second, time.Millisecond)
	_, err = c.RequestRegion(ctx, 64, rdma.RemoteRead, rdma.RegionLifetime(0))
	require.ErrorIs(t, err, rdma.ErrInvalid)

	// The granter's own bound applies when the request asks for more.
	c2, s2 := rdmatest.Pair(t, append(opts, rdma.WithRegionLifetime(100*time.Millisecond))...)
	src2, err := c2.Alloc(64)
	require.NoError(t, err)
	defer src2.Release()
	r2, err := c2.RequestRegion(ctx, 4096, rdma.RemoteWrite, rdma.RegionLifetime(time.Hour))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return errors.Is(c2.Write(src2, r2).Wait(ctx), rdma.ErrRegionRevoked)
	}, 20*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { b, _ := rdma.Granted(s2); return b == 0 }, 10*time.Second, time.Millisecond)
	// The connection is still good.
	rcv := s2.Recv()
	wait(t, c2.Send(src2))
	wait(t, rcv)
	rcv.Buffer().Release()
}

// Rule: Revoke is orderly. Accesses the peer has in flight complete; the
// ones it posts after it heard fail with ErrRegionRevoked; none is a
// remote access error, and the connection stays up.
func TestOrderlyRevoke(t *testing.T) { eachProvider(t, testOrderlyRevoke) }

func testOrderlyRevoke(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := c.Alloc(4096)
	require.NoError(t, err)
	defer src.Release()
	for round := range 20 {
		b, err := s.Alloc(1 << 20)
		require.NoError(t, err)
		region, err := s.Expose(b, rdma.RemoteWrite|rdma.RemoteRead)
		require.NoError(t, err)
		require.NoError(t, s.SendRegion(ctx, region))
		remote, err := c.RecvRegion(ctx)
		require.NoError(t, err)
		var fs []*rdma.Future
		done := make(chan error, 1)
		for i := range 100 {
			if i == 10 {
				go func() { done <- s.Revoke(ctx, region) }()
			}
			dst, _ := remote.Slice((i%256)*4096, 4096)
			if i%2 == 0 {
				fs = append(fs, c.Write(src, dst))
			} else {
				fs = append(fs, c.Read(src, dst))
			}
		}
		require.NoError(t, <-done)
		for _, f := range fs {
			if err := f.Wait(ctx); err != nil {
				require.ErrorIs(t, err, rdma.ErrRegionRevoked, "round %d", round)
			}
		}
		require.ErrorIs(t, c.Write(src, remote).Wait(ctx), rdma.ErrRegionRevoked)
		require.Equal(t, 0, rdma.Exposed(s))
		require.NoError(t, b.Release())
	}
	r := s.Recv()
	wait(t, c.Send(src))
	wait(t, r)
	r.Buffer().Release()
}

// Rule: a peer that does not answer a revoke within its bound is cut
// off, and the memory is deregistered then.
func TestRevokeUnanswered(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdma.Deafen(c)
	b, err := s.Alloc(4096)
	require.NoError(t, err)
	defer b.Release()
	region, err := s.Expose(b, rdma.RemoteWrite)
	require.NoError(t, err)
	r := s.Recv()
	require.ErrorIs(t, s.Revoke(ctx, region), rdma.ErrProtocol)
	require.Equal(t, 0, rdma.Exposed(s))
	failedWith(t, r, rdma.ErrProtocol)
}

// Rule: a Recv can be withdrawn while it has matched no message; a
// withdrawn Recv never takes one, and one that matched hands it over.
func TestRecvCancel(t *testing.T) { eachProvider(t, testRecvCancel) }

func testRecvCancel(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.Alloc(1)
	require.NoError(t, err)
	defer b.Release()

	abandoned := s.Recv()
	short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	require.ErrorIs(t, abandoned.Wait(short), context.DeadlineExceeded)
	stop()
	require.True(t, abandoned.Cancel())
	require.ErrorIs(t, abandoned.Err(), context.Canceled)
	require.False(t, abandoned.Cancel(), "a second Cancel")
	b.Bytes()[0] = 'A'
	next := s.Recv()
	wait(t, c.Send(b))
	wait(t, next)
	require.Equal(t, "A", string(next.Buffer().Bytes()), "the message goes to the next Recv")
	next.Buffer().Release()

	matched := s.Recv()
	b.Bytes()[0] = 'B'
	sent := c.Send(b)
	wait(t, matched)
	require.False(t, matched.Cancel())
	require.Equal(t, "B", string(matched.Buffer().Bytes()))
	matched.Buffer().Release()
	wait(t, sent)
	require.False(t, sent.Cancel(), "a posted operation cannot be withdrawn")
}

// Rule: sockets that never say hello keep no client out and hold
// nothing costly: no queue pair, no receive, no registered memory. They
// are dropped after the handshake timeout, or sooner when too many wait.
func TestIdleSockets(t *testing.T) {
	const timeout = 2 * time.Second
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderSoft), rdma.WithHandshakeTimeout(timeout))
	require.NoError(t, err)
	defer ln.Close()
	var idle []net.Conn
	defer func() {
		for _, tc := range idle {
			tc.Close()
		}
	}()
	// More than the listener lets wait for a hello, and more than its
	// handshake slots.
	for range 1100 {
		tc, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		idle = append(idle, tc)
	}
	require.Zero(t, ln.PoolStats().BytesRegistered, "idle sockets hold registered memory")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	acc := make(chan *rdma.Conn, 1)
	go func() { s, _ := ln.Accept(ctx); acc <- s }()
	start := time.Now()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithProvider(rdma.ProviderSoft))
	require.NoError(t, err, "a real client got in within the handshake timeout")
	t.Logf("dial with 1100 idle sockets: %v", time.Since(start))
	defer c.Close()
	s := <-acc
	require.NotNil(t, s)
	defer s.Close()
	// An idle socket is dropped by the listener in bounded time.
	buf := make([]byte, 1)
	idle[len(idle)-1].SetReadDeadline(time.Now().Add(3 * timeout))
	_, err = idle[len(idle)-1].Read(buf)
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "timeout"), "the listener did not drop an idle socket: %v", err)
}

// Rule: Listen refuses a configuration it cannot serve, and a dial the
// listener must refuse learns why.
func TestListenConfig(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	_, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithQueueDepth(16384, 16384))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Contains(t, err.Error(), "queue")
	_, err = rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithPoolLimit(4<<20), rdma.WithQueueDepth(128, 128))
	require.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Contains(t, err.Error(), "pool limit")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = rdma.Dial(ctx, "rdma", "127.0.0.1:1", soft, rdma.WithQueueDepth(16384, 16384))
	require.ErrorIs(t, err, rdma.ErrInvalid)
}

// Rule: a control frame longer than the protocol allows is reported to
// the peer that sent it, at once, as every other illegal frame is: its
// pending operations fail with ErrPeerClosed saying why, its Done
// closes, and the socket ends, without the receiving application doing
// anything.
func TestOversizedControlFrameReported(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pending := c.Recv() // the hostile side's own operation
	victim := s.Recv()
	frame := []byte{rdma.CtrlRegion, 0, 0}
	binary.BigEndian.PutUint16(frame[1:], rdma.MaxCtrl+1)
	require.NoError(t, rdma.SendRawControl(c, append(frame, make([]byte, rdma.MaxCtrl+1)...)))
	failedWith(t, victim, rdma.ErrProtocol)
	bound, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	err := pending.Wait(bound)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the hostile peer was not told")
	require.ErrorIs(t, err, rdma.ErrPeerClosed)
	assert.Contains(t, err.Error(), "aborted")
	assert.Contains(t, err.Error(), "control frame of 1025 bytes", "the reason")
	select {
	case <-c.Done():
	case <-bound.Done():
		t.Fatal("the hostile peer's connection did not end")
	}
}

// forged is text a hostile peer sends to forge lines of a log: a line
// end, a carriage return and a terminal escape.
const forged = "no\nrdma: connected remote=10.0.0.1\r\x1b[2K"

// requirePrintable requires s to hold no control character: the peer's
// text in it is quoted.
func requirePrintable(t *testing.T, s string) {
	t.Helper()
	for _, r := range s {
		require.False(t, r < 0x20 || r == 0x7f, "control character %q in %q", r, s)
	}
}

// Rule: text a peer sends reaches this side's errors quoted: a
// listener's refusal reason and a region request's denial.
func TestPeerTextQuoted(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	t.Run("refusal", func(t *testing.T) {
		ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithAcceptCheck(func(rdma.PeerInfo) error { return errors.New(forged) }))
		require.NoError(t, err)
		defer ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), soft)
		require.ErrorIs(t, err, rdma.ErrRefused)
		requirePrintable(t, err.Error())
		assert.Contains(t, err.Error(), strconv.Quote("the listener's check refused the peer: "+forged))
	})
	t.Run("region denial", func(t *testing.T) {
		c, s := rdmatest.Pair(t, soft)
		rdma.Deafen(s) // the hostile side answers in its own words
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got := make(chan error, 1)
		go func() {
			_, err := c.RequestRegion(ctx, 64, rdma.RemoteRead)
			got <- err
		}()
		require.Eventually(t, func() bool { return rdma.RequestsInFlight(c) == 1 }, 10*time.Second, time.Millisecond)
		require.NoError(t, rdma.SendControl(s, rdma.CtrlDeny, append(binary.BigEndian.AppendUint32(nil, 1), forged...)))
		err := <-got
		require.ErrorIs(t, err, rdma.ErrRegionRefused)
		requirePrintable(t, err.Error())
		assert.Contains(t, err.Error(), strconv.Quote(forged))
	})
}

// Rule: dialing a server of another protocol, the most common mistake
// being an HTTP port for the RDMA one, fails in milliseconds, not at the
// handshake's bound, with ErrNotRDMA quoting what answered.
func TestDialOtherServerFailsFast(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	const bound = 10 * time.Second // the default handshake bound
	banner := func(t *testing.T, text string) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		done := make(chan struct{})
		t.Cleanup(func() { ln.Close(); <-done })
		go func() {
			defer close(done)
			tc, err := ln.Accept()
			if err != nil {
				return
			}
			defer tc.Close()
			tc.Write([]byte(text))
			tc.SetReadDeadline(time.Now().Add(bound))
			io.Copy(io.Discard, tc) // it waits for the dialer, as an SSH server does
		}()
		return ln.Addr().String()
	}
	for _, tc := range []struct {
		name, addr, want string
		tls              bool
	}{
		{"HTTP", httpServer(t, false), `an HTTP server answered: "HTTP/1.1 400 Bad Request`, false},
		{"HTTPS", httpServer(t, true), "closed", false},
		{"SSH", banner(t, "SSH-2.0-OpenSSH_9.2\r\n"), `the peer answered "SSH-2.0-OpenSSH_9.2\r\n"`, false},
		// A TLS dialer: the server answers its ClientHello in clear text,
		// as nginx does to what is no HTTP request.
		{"HTTP to TLS", banner(t, "HTTP/1.1 400 Bad Request\r\n\r\n"), `an HTTP server answered: "HTTP/"`, true},
		{"SSH to TLS", banner(t, "SSH-2.0-OpenSSH_9.2\r\n"), `the peer answered "SSH-2"`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*bound)
			defer cancel()
			opts := []rdma.Option{soft, rdma.WithHandshakeTimeout(bound)}
			if tc.tls {
				opts = append(opts, rdma.WithTLS(&tls.Config{InsecureSkipVerify: true}))
			}
			start := time.Now()
			_, err := rdma.Dial(ctx, "rdma", tc.addr, opts...)
			took := time.Since(start)
			t.Logf("%v: %v", took, err)
			require.ErrorIs(t, err, rdma.ErrNotRDMA)
			assert.Contains(t, err.Error(), tc.want)
			requirePrintable(t, err.Error())
			assert.Less(t, took, bound/10, "the dial waited for the handshake's bound")
		})
	}
}

// httpServer is a net/http server (over TLS when secure) whose handler
// is never reached; it closes when the test ends.
func httpServer(t *testing.T, secure bool) string {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Error("a go-rdma hello reached the handler") })
	var srv *httptest.Server
	if secure {
		srv = httptest.NewUnstartedServer(h)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // its complaint about the TLS handshake
		srv.StartTLS()
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// Rule: handshakes a peer leaves unfinished never keep a real client
// out, with TLS or without. An attacker replays a recorded hello from
// many sockets and then says nothing; a real client still dials
// promptly, and the attacker's sockets cost at most the listener's
// bounded handshakes in queue pairs and a goroutine each.
func TestReplayedHellos(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testReplayedHellos(t, false) })
	t.Run("TLS", func(t *testing.T) { testReplayedHellos(t, true) })
}

func testReplayedHellos(t *testing.T, secure bool) {
	const attackers = 100
	const bound = 10 * time.Second // the default handshake bound
	soft := rdma.WithProvider(rdma.ProviderSoft)
	p := newTestPKI(t)
	var lnOpts []rdma.ListenOption
	var dialOpts []rdma.Option
	var dialTLS *tls.Config
	if secure {
		lnOpts = append(lnOpts, rdma.WithTLS(&tls.Config{Certificates: []tls.Certificate{p.server}}))
		dialTLS = p.clientTLS()
		dialOpts = append(dialOpts, rdma.WithTLS(dialTLS))
	}
	x, err := rdma.OpenEngine(soft)
	require.NoError(t, err)
	defer func() { assert.NoError(t, x.Close()) }()
	ln, err := x.Listen("rdma", "127.0.0.1:0", lnOpts...)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*bound)
	defer cancel()
	dial := func() (time.Duration, error) {
		acc := make(chan *rdma.Conn, 1)
		go func() { s, _ := ln.Accept(ctx); acc <- s }()
		start := time.Now()
		c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), append(dialOpts, soft)...)
		took := time.Since(start)
		if err != nil {
			return took, err
		}
		c.Close()
		if s := <-acc; s != nil {
			s.Close()
		}
		return took, nil
	}
	// open opens a socket to the listener, in TLS when it needs it.
	open := func() (net.Conn, error) {
		tc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil || !secure {
			return tc, err
		}
		cfg := dialTLS.Clone()
		cfg.ServerName = "127.0.0.1"
		s := tls.Client(tc, cfg)
		s.SetDeadline(time.Now().Add(bound))
		if err := s.HandshakeContext(ctx); err != nil {
			tc.Close()
			return nil, err
		}
		s.SetDeadline(time.Time{})
		return s, nil
	}

	hello := recordHello(t, ctx, secure, p, append(dialOpts, soft))
	base, err := dial()
	require.NoError(t, err, "a dial before the attack")
	goroutines := runtime.NumGoroutine()

	var socks []net.Conn
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	for range attackers {
		tc, err := open()
		require.NoError(t, err)
		socks = append(socks, tc)
		_, err = tc.Write(hello)
		require.NoError(t, err)
	}
	// Every handshake slot holds a replay.
	most := 0
	require.Eventually(t, func() bool {
		most = max(most, x.Stats().Conns)
		return x.Stats().Conns >= rdma.MaxHandshakes
	}, bound, time.Millisecond, "the replays took no handshake slot")

	took, err := dial()
	t.Logf("dial: %v before the attack, %v during it", base, took)
	require.NoError(t, err, "a real client was kept out")
	assert.Less(t, took, bound/4, "the real client waited for the replays' bound")
	most = max(most, x.Stats().Conns)
	assert.LessOrEqual(t, most, rdma.MaxHandshakes, "queue pairs made for the replays")
	extra := runtime.NumGoroutine() - goroutines
	t.Logf("goroutines: %d more with %d replays", extra, attackers)
	// A goroutine per socket, and on soft one per queue pair.
	assert.LessOrEqual(t, extra, attackers+rdma.MaxHandshakes, "goroutines per replay")
}

// recordHello records the hello a real dialer sends (with opts), as an
// attacker on the path, or the dialer itself, could.
func recordHello(t *testing.T, ctx context.Context, secure bool, p testPKI, opts []rdma.Option) []byte {
	t.Helper()
	var ln net.Listener
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	if secure {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{p.server}})
	}
	got := make(chan []byte, 1)
	go func() {
		tc, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, rdma.HelloSize)
		if _, err := io.ReadFull(tc, b); err != nil {
			b = nil
		}
		got <- b
	}()
	_, err = rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	require.Error(t, err, "the recorder answers nothing")
	b := <-got
	require.Len(t, b, rdma.HelloSize)
	return b
}
