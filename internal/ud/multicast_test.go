package ud

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sendImm sends msg from e to group:port as WriteTo does, but with the
// immediate data imm (0: none), as a peer that is not a go-rdma endpoint
// might.
func sendImm(t *testing.T, e *Endpoint, to netip.AddrPort, msg string, imm uint32) {
	t.Helper()
	d, err := e.admit(len(msg), NewAddr(to))
	require.NoError(t, err)
	d.imm = imm
	pb, err := e.eng.Pool.Get(len(msg))
	require.NoError(t, err)
	copy(pb.Bytes(), msg)
	require.NoError(t, e.post(pb, 0, len(msg), d, true, nil))
}

// Rule: a member takes a datagram to its group only with the immediate
// a WriteTo to its own group:port puts there: one without immediate
// data, with another tag, or naming another port is dropped and counted
// (DroppedMulticast), and the well-formed one after them is the first
// read.
func TestMulticastImmediateChecked(t *testing.T) {
	e := softEngine(t)
	a, b := listen(t, e, Config{}), listen(t, e, Config{})
	group := netip.MustParseAddr("239.71.82.9")
	require.NoError(t, b.Join(group))
	port := b.LocalAddr().AddrPort().Port()
	to := netip.AddrPortFrom(group, port)
	sendImm(t, a, to, "no immediate", 0)
	sendImm(t, a, to, "another tag", 0x12340000|uint32(port))
	sendImm(t, a, to, "another port", mcastImm(port+1))
	sendImm(t, a, to, "for b", mcastImm(port))
	msg, from := read(t, b)
	assert.Equal(t, "for b", msg)
	assert.Equal(t, a.QPN(), from.route.QPN)
	st := b.Stats()
	assert.Equal(t, uint64(3), st.DroppedMulticast)
	assert.Equal(t, uint64(4), st.Received)
}

// Rule: writing to a group asks no side channel and makes its address
// handle once; the handles to groups are bounded (maxSendGroups), the
// least recently used first out, apart from the peers' cache.
func TestMulticastSendCache(t *testing.T) {
	e := softEngine(t)
	a := listen(t, e, Config{})
	for i := range maxSendGroups + 6 {
		for range 2 {
			_, err := a.WriteTo([]byte("x"), NewAddr(netip.AddrPortFrom(netip.AddrFrom4([4]byte{239, 71, 85, byte(i)}), 9)))
			require.NoError(t, err)
		}
	}
	a.mc.sendTo.mu.Lock()
	n, evicted := a.mc.sendTo.lru.Len(), a.mc.sendTo.evicted
	a.mc.sendTo.mu.Unlock()
	assert.Equal(t, maxSendGroups, n)
	assert.Equal(t, uint64(6), evicted)
	st := a.Stats()
	assert.Zero(t, st.Resolved+st.ResolveFailed, "no side channel asked")
	assert.Zero(t, st.Peers)
	assert.Equal(t, uint64(2*(maxSendGroups+6)), st.Sent)
}
