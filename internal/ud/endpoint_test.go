package ud

import (
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
