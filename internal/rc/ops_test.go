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
