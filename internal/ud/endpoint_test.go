package ud

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

func softEngine(t *testing.T) *engine.Engine {
	t.Helper()
	e, err := engine.Open(engine.Config{Port: 1}, soft.Provider, "")
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.Zero(t, e.Pool.Stats().BuffersInUse, "pool buffers in use after the endpoints closed")
		assert.NoError(t, e.Release())
	})
	return e
}

func listen(t *testing.T, e *engine.Engine, cfg Config) *Endpoint {
	t.Helper()
	ep, err := Listen(e, netip.MustParseAddrPort("127.0.0.1:0"), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ep.Close()) })
	return ep
}

func read(t *testing.T, ep *Endpoint) (string, *Addr) {
	t.Helper()
	ep.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 64)
	n, a, err := ep.ReadFrom(b)
	require.NoError(t, err)
	return string(b[:n]), a
}

// Rule: a datagram from a sender the cache does not hold (evicted here)
// reads as from its IP, port 0 and QP number, and a reply to that
// address reaches it.
func TestRouteOnlySender(t *testing.T) {
	e := softEngine(t)
	b := listen(t, e, Config{MaxPeers: 1})
	a, c := listen(t, e, Config{}), listen(t, e, Config{})
	_, err := a.WriteTo([]byte("from a"), b.LocalAddr())
	require.NoError(t, err)
	msg, from := read(t, b)
	assert.Equal(t, "from a", msg)
	assert.Equal(t, a.LocalAddr().String(), from.String())
	_, err = c.WriteTo([]byte("from c"), b.LocalAddr()) // evicts a at b
	require.NoError(t, err)
	msg, from = read(t, b)
	assert.Equal(t, "from c", msg)
	assert.Equal(t, c.LocalAddr().String(), from.String())
	assert.Equal(t, uint64(1), b.Stats().Evicted)

	_, err = a.WriteTo([]byte("a again"), b.LocalAddr()) // a still knows b
	require.NoError(t, err)
	msg, from = read(t, b)
	assert.Equal(t, "a again", msg)
	assert.Equal(t, uint16(0), from.AddrPort().Port(), "an evicted sender reads by route: %v", from)
	assert.True(t, strings.HasSuffix(from.String(), "#qp"+strconv.FormatUint(uint64(a.QPN()), 16)), "%v names a's QPN %#x", from, a.QPN())
	_, err = b.WriteTo([]byte("reply"), from)
	require.NoError(t, err)
	msg, from = read(t, a)
	assert.Equal(t, "reply", msg)
	assert.Equal(t, b.LocalAddr().String(), from.String())
}

// Rule: WriteTo refuses an address that names no endpoint to ask (port
// 0, an unspecified IP) without asking.
func TestWriteToBadAddress(t *testing.T) {
	e := softEngine(t)
	a := listen(t, e, Config{})
	for _, s := range []string{"127.0.0.1:0", "0.0.0.0:9", "[::]:9"} {
		_, err := a.WriteTo([]byte("x"), NewAddr(netip.MustParseAddrPort(s)))
		assert.Error(t, err, s)
	}
	assert.Zero(t, a.Stats().Resolved+a.Stats().ResolveFailed)
}

// Rule: a peer that restarts on the same ip:port with a new QP is found
// again: a WriteTo to a route older than RefreshAfter asks the side
// channel again in the background, and the datagrams after the answer
// reach the new QP, which knows the writer from its request.
func TestRestartedPeer(t *testing.T) {
	e := softEngine(t)
	a := listen(t, e, Config{RefreshAfter: time.Millisecond})
	b, err := Listen(e, netip.MustParseAddrPort("127.0.0.1:0"), Config{})
	require.NoError(t, err)
	_, err = a.WriteTo([]byte("one"), b.LocalAddr())
	require.NoError(t, err)
	msg, _ := read(t, b)
	require.Equal(t, "one", msg)
	ap, old := b.LocalAddr().AddrPort(), b.QPN()
	require.NoError(t, b.Close())
	b2, err := Listen(e, ap, Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b2.Close()) })
	require.NotEqual(t, old, b2.QPN())
	buf := make([]byte, 16)
	end := time.Now().Add(10 * time.Second)
	for {
		// Until the answer, datagrams go to the old QP and are lost.
		_, err := a.WriteTo([]byte("two"), NewAddr(ap))
		require.NoError(t, err)
		b2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, from, err := b2.ReadFrom(buf)
		if err == nil {
			assert.Equal(t, "two", string(buf[:n]))
			assert.Equal(t, a.LocalAddr().String(), from.String())
			break
		}
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.True(t, time.Now().Before(end), "the restarted peer never reached: %+v", a.Stats())
	}
	assert.GreaterOrEqual(t, a.Stats().Resolved, uint64(2))
}

// Rule: answers are rate-bounded: a flood of valid requests gets at
// most the burst and the rate's worth of answers, the rest are ignored
// and counted, and the requests, all from one address, hold one entry
// of the cache however many routes they claim.
func TestRequestFlood(t *testing.T) {
	e := softEngine(t)
	b := listen(t, e, Config{})
	u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	require.NoError(t, err)
	defer u.Close()
	to := net.UDPAddrFromAddrPort(b.LocalAddr().AddrPort())
	const n, chunk = 300, 30
	start := time.Now()
	var m [msgSize]byte
	for i := range n {
		r := Route{GID: verbs.GIDFromIP(netip.MustParseAddr("127.0.0.1")), LID: 1, QPN: uint32(0x1000 + i), QKey: QKey, MTU: 4096}
		(&msg{kind: kindReq, nonce: uint64(i), route: r}).put(m[:])
		_, err := u.WriteTo(m[:], to)
		require.NoError(t, err)
		if (i+1)%chunk == 0 { // a chunk at a time, so that the socket's buffer drops none
			require.Eventually(t, func() bool { st := b.Stats(); return st.Answered+st.Ignored == uint64(i+1) }, 10*time.Second, 100*time.Microsecond,
				"%d requests sent: %+v", i+1, b.Stats())
		}
	}
	elapsed := time.Since(start)
	st := b.Stats()
	assert.LessOrEqual(t, float64(st.Answered), answerBurst+answerRate*elapsed.Seconds()+1, "answered %d in %v", st.Answered, elapsed)
	assert.Less(t, st.Answered, uint64(n), "no answer was held back")
	assert.Equal(t, 1, st.Peers, "one sender, one entry")
}

// Rule: a sender that floods an endpoint's QP (an unknown QP here, not
// a PacketConn) with datagrams nobody reads gets the receive depth of
// them queued and the rest dropped and counted; the pool's buffers in use
// stay bounded (the receives posted and the queue), and the datagrams
// read afterwards are whole, from an address known by route.
func TestDatagramFlood(t *testing.T) {
	e := softEngine(t)
	const depth = 16
	b := listen(t, e, Config{RecvDepth: depth})
	pd := e.PD
	cq, err := e.Ctx.CreateCQ(64, nil)
	require.NoError(t, err)
	defer cq.Close()
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.UD, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	defer qp.Close()
	require.NoError(t, qp.ToInit(verbs.InitAttr{Port: 1, QKey: QKey}))
	require.NoError(t, qp.ToRTR(verbs.RTRAttr{}))
	require.NoError(t, qp.ToRTS(verbs.RTSAttr{}))
	ah, err := pd.CreateAH(verbs.Address{Port: 1, LID: b.route.LID, GID: b.route.GID, HopLimit: 64})
	require.NoError(t, err)
	defer ah.Close()
	src, err := e.Pool.Get(64)
	require.NoError(t, err)
	defer src.Release()
	copy(src.Bytes(), "flood")
	wcs := make([]verbs.WorkCompletion, 32)
	const batches = 20
	for k := range batches {
		for range depth {
			_, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: src.Addr(), Length: 5, LKey: src.LKey()}},
				AH: ah, RemoteQPN: b.QPN(), RemoteQKey: QKey}})
			require.NoError(t, err)
		}
		for got := 0; got < depth; {
			n, err := cq.Poll(wcs)
			require.NoError(t, err)
			for _, wc := range wcs[:n] {
				require.NoError(t, wc.Err())
			}
			got += n
		}
		// A batch at a time, each received (its receives posted again)
		// before the next comes: only the queue drops them, none
		// finds no receive posted.
		require.Eventually(t, func() bool { return b.Stats().Received == uint64((k+1)*depth) }, 10*time.Second, 100*time.Microsecond, "%+v", b.Stats())
		// The receives, the queue, the GRH slots and src.
		assert.LessOrEqual(t, e.Pool.Stats().BuffersInUse, 2*depth+2, "buffers in use")
	}
	st := b.Stats()
	assert.Equal(t, uint64((batches-1)*depth), st.DroppedQueueFull, "%+v", st)
	b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	read := 0
	for {
		buf := make([]byte, 16)
		n, from, err := b.ReadFrom(buf)
		if err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			break
		}
		read++
		assert.Equal(t, "flood", string(buf[:n]))
		assert.Equal(t, uint16(0), from.AddrPort().Port(), "an unknown sender reads by route")
	}
	assert.Equal(t, depth, read, "the queue holds the receive depth")
}
