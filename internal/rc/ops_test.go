package rc

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpRecordSize: the start time of a sampled op costs the op table no
// memory: an op still fits 56 bytes and a slot 64 (on 64-bit).
func TestOpRecordSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("sizes of a 64-bit build")
	}
	assert.Equal(t, uintptr(56), unsafe.Sizeof(Op{}))
	assert.Equal(t, uintptr(64), unsafe.Sizeof(slot{}))
}

// TestOpTable: a wr_id finds its op once; a stale or unknown one finds
// nothing, and a freed index comes back with a new generation.
func TestOpTable(t *testing.T) {
	var tb OpTable
	tb.Init(7 << 40)
	a := tb.Add(Op{Kind: OpSend, N: 1})
	b := tb.Add(Op{Kind: OpWrite, N: 2})
	assert.Equal(t, uint64(7), a>>40, "the slot base is in the wr_id")
	assert.ElementsMatch(t, []uint64{a, b}, tb.IDs())

	o, ok := tb.Take(a)
	require.True(t, ok)
	assert.Equal(t, OpSend, o.Kind)
	assert.Equal(t, 1, o.N)
	_, ok = tb.Take(a)
	assert.False(t, ok, "taken twice")

	c := tb.Add(Op{Kind: OpRead})
	assert.Equal(t, a&(maxOps-1), c&(maxOps-1), "the freed index is reused")
	assert.NotEqual(t, a, c, "with a new generation")
	_, ok = tb.Take(a)
	assert.False(t, ok, "a stale wr_id finds nothing")
	_, ok = tb.Take(1<<19 | 7<<40)
	assert.False(t, ok, "an unknown index finds nothing")
	assert.ElementsMatch(t, []uint64{b, c}, tb.IDs())
}

// TestLifeDrained: the teardown's wait ends when the last WR in flight
// finishes, or at once when none is; not before the teardown began.
func TestLifeDrained(t *testing.T) {
	var l Life
	l.Init(nil)
	l.AddInflight()
	l.OpDone()
	select {
	case <-l.Drained():
		t.Fatal("drained before the teardown began")
	default:
	}
	l.AddInflight()
	l.BeginTeardown()
	select {
	case <-l.Drained():
		t.Fatal("drained with a WR in flight")
	default:
	}
	l.OpDone()
	select {
	case <-l.Drained():
	default:
		t.Fatal("not drained after the last WR finished")
	}
}

// TestLifeErrors: the first error counts; a close heard twice is heard
// once, and marks the peer closed.
func TestLifeErrors(t *testing.T) {
	var l Life
	l.Init(nil)
	assert.False(t, l.Ending())
	require.NoError(t, l.Err())
	assert.True(t, l.Fail(ErrPeerLost))
	assert.False(t, l.Fail(ErrProtocol))
	assert.ErrorIs(t, l.Err(), ErrPeerLost)
	assert.ErrorIs(t, l.ClosedErr(), ErrPeerLost)
	assert.True(t, l.Ending())

	var m Life
	m.Init(nil)
	assert.False(t, m.HearClose())
	assert.True(t, m.HearClose())
	assert.True(t, m.PeerClosed())
	assert.True(t, m.Orderly())
}
