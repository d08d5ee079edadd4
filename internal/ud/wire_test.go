package ud

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

func testRoute() Route {
	return Route{GID: verbs.GIDFromIP(netip.MustParseAddr("10.0.0.1")), LID: 7, QPN: 0x1234, QKey: QKey, MTU: 4096}
}

// Rule: a message parses back to what was put.
func TestMsgRoundTrip(t *testing.T) {
	for _, kind := range []uint8{kindReq, kindAns} {
		m := msg{kind: kind, nonce: 0x0102030405060708, route: testRoute()}
		var b [msgSize]byte
		m.put(b[:])
		got, err := parseMsg(b[:])
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
}

// Rule: a peer's message is refused unless it is exactly one message of
// a known kind with a route that can be: every other length, kind,
// version, magic, QPN past 24 bits (or 0, 1 and the multicast QPN),
// privileged Q_Key, zero or multicast GID, and MTU that is no IB MTU. Random bytes never parse
// and never panic.
func TestMsgHostile(t *testing.T) {
	good := msg{kind: kindReq, nonce: 1, route: testRoute()}
	var b [msgSize]byte
	good.put(b[:])
	for n := 0; n <= 2*msgSize; n++ {
		if n == msgSize {
			continue
		}
		buf := make([]byte, n)
		copy(buf, b[:])
		_, err := parseMsg(buf)
		assert.ErrorIs(t, err, errBadMsg, "%d bytes", n)
	}
	mutate := map[string]func(m *msg, b []byte){
		"magic":            func(_ *msg, b []byte) { b[0] = 'X' },
		"version":          func(_ *msg, b []byte) { b[4] = 2 },
		"kind 0":           func(_ *msg, b []byte) { b[5] = 0 },
		"kind 3":           func(_ *msg, b []byte) { b[5] = 3 },
		"QPN 0":            func(m *msg, _ []byte) { m.route.QPN = 0 },
		"QPN 1":            func(m *msg, _ []byte) { m.route.QPN = 1 },
		"QPN mcast":        func(m *msg, _ []byte) { m.route.QPN = verbs.MulticastQPN },
		"QPN 2^24":         func(m *msg, _ []byte) { m.route.QPN = 1 << 24 },
		"Q_Key privileged": func(m *msg, _ []byte) { m.route.QKey |= privilegedQKey },
		"GID zero":         func(m *msg, _ []byte) { m.route.GID = verbs.GID{} },
		"GID mcast":        func(m *msg, _ []byte) { m.route.GID = verbs.GIDFromIP(netip.MustParseAddr("239.1.1.1")) },
		"MTU 0":            func(m *msg, _ []byte) { m.route.MTU = 0 },
		"MTU 1500":         func(m *msg, _ []byte) { m.route.MTU = 1500 },
		"MTU 8192":         func(m *msg, _ []byte) { m.route.MTU = 8192 },
	}
	for name, f := range mutate {
		m := good
		var b [msgSize]byte
		f(&m, b[:]) // a change of the message is written by put below
		m.put(b[:])
		f(&m, b[:]) // a change of the bytes survives put
		_, err := parseMsg(b[:])
		assert.ErrorIs(t, err, errBadMsg, name)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		buf := make([]byte, msgSize)
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		if r.IntN(2) == 0 {
			copy(buf, msgMagic)
			buf[4] = msgVersion
		}
		if m, err := parseMsg(buf); err == nil {
			// What parses is a route a UD QP can have.
			assert.True(t, m.route.QPN >= 2 && m.route.QPN < verbs.MulticastQPN)
			assert.False(t, m.route.GID.IsZero())
		}
	}
}

// Rule: the answer rate is bounded: a burst, then rate a second.
func TestTokenBucket(t *testing.T) {
	l := tokenBucket{rate: 10, burst: 3}
	now := time.Unix(1000, 0)
	for i := range 3 {
		assert.True(t, l.allow(now), "burst %d", i)
	}
	assert.False(t, l.allow(now), "past the burst")
	assert.False(t, l.allow(now.Add(50*time.Millisecond)), "half a token later")
	assert.True(t, l.allow(now.Add(100*time.Millisecond)), "a token later")
	assert.False(t, l.allow(now.Add(100*time.Millisecond)))
	assert.True(t, l.allow(now.Add(time.Hour)), "refilled")
	assert.True(t, l.allow(now.Add(time.Hour)))
	assert.True(t, l.allow(now.Add(time.Hour)))
	assert.False(t, l.allow(now.Add(time.Hour)), "refilled only up to the burst")
}
