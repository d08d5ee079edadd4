package ud

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// fakeAH counts the handles open.
type fakeAH struct{ open *int }

func (a fakeAH) Close() error { *a.open--; return nil }

func peerRoute(i int) Route {
	r := testRoute()
	r.QPN = uint32(0x100 + i)
	return r
}

func peerAt(c *peers, ap netip.AddrPort) *peer {
	p, _ := c.byAddrPort(ap, time.Hour)
	return p
}

func peerAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(1000+i))
}

// Rule: the cache holds at most its bound, evicting the least recently
// used; an evicted peer's address handle closes once no send holds it,
// and every handle is closed when the cache is cleared.
func TestPeersBoundAndHandles(t *testing.T) {
	open, made := 0, 0
	c := newPeers(4, func(Route) (verbs.AH, error) { open++; made++; return fakeAH{&open}, nil }, nil)
	var held []*ahRef
	for i := range 6 {
		p := c.learn(peerAddr(i), peerRoute(i))
		r, err := c.ah(p)
		require.NoError(t, err)
		held = append(held, r) // a send in flight
		if i == 3 {
			assert.NotNil(t, peerAt(c, peerAddr(0)), "peer 0 used again: peer 1 is now the oldest")
		}
	}
	assert.Equal(t, 4, c.lru.Len())
	assert.Equal(t, uint64(2), c.evicted)
	assert.Nil(t, peerAt(c, peerAddr(1)), "the least recently used went first")
	assert.Nil(t, peerAt(c, peerAddr(2)))
	assert.NotNil(t, peerAt(c, peerAddr(0)))
	assert.NotNil(t, c.from(peerRoute(5).key()))
	assert.Nil(t, c.from(peerRoute(1).key()))
	assert.Equal(t, 6, open, "the evicted peers' handles stay open while their sends hold them")
	held[1].release()
	held[2].release()
	assert.Equal(t, 4, open)
	// A peer learnt again at a new route replaces its entry.
	r := peerRoute(9)
	p := c.learn(peerAddr(0), r)
	assert.Equal(t, r, p.route)
	assert.Nil(t, c.from(peerRoute(0).key()))
	assert.Equal(t, 4, c.lru.Len())
	c.clear()
	for _, i := range []int{0, 3, 4, 5} {
		held[i].release()
	}
	assert.Zero(t, open, "handles left open")
	assert.Equal(t, 6, made)
}

// Rule: a send to a peer evicted after it was looked up gets a handle of
// its own, closed with the send.
func TestPeersEvictedSend(t *testing.T) {
	open := 0
	c := newPeers(1, func(Route) (verbs.AH, error) { open++; return fakeAH{&open}, nil }, nil)
	p := c.learn(peerAddr(0), peerRoute(0))
	c.learn(peerAddr(1), peerRoute(1)) // evicts p
	r, err := c.ah(p)
	require.NoError(t, err)
	assert.Equal(t, 1, open)
	r.release()
	assert.Zero(t, open)
	c.clear()
}
