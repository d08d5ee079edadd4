package rc

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// memReg registers memory for a pool without a device: an MR's address
// is its memory's, so that a fake post reads what an SGE names.
type memReg struct{ regs [][]byte }

type memMR struct {
	verbs.MR
	b []byte
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

func (r *memReg) RegMR(b []byte, _ verbs.Access) (verbs.MR, error) {
	r.regs = append(r.regs, b)
	return memMR{b: b}, nil
}
func (m memMR) Addr() uint64 { return addrOf(m.b) }
func (m memMR) LKey() uint32 { return 7 }
func (m memMR) Close() error { return nil }

// read is what s names in the registered memory.
func (r *memReg) read(s verbs.SGE) string {
	for _, b := range r.regs {
		if base := addrOf(b); s.Addr >= base && s.Addr+uint64(s.Length) <= base+uint64(len(b)) {
			return string(b[s.Addr-base : s.Addr-base+uint64(s.Length)])
		}
	}
	panic("SGE outside the registered memory")
}

// An inline operation that is not posted at its call (postMu is taken,
// or the send queue has no room) is posted from a copy of its bytes: the
// caller may change its own, and release its buffer, as soon as the call
// returns; the copy goes back to the pool at the completion.
func TestSendQueueStagesInline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		depth int  // 1: the second operation waits for room
		hold  bool // postMu is taken: both wait in the combining queue
	}{
		{"combining queue", 8, true},
		{"waiting for room", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := &memReg{}
			pl, err := pool.New(reg, pool.Options{})
			require.NoError(t, err)
			defer pl.Close()
			q, p := newSendQueue(t, tc.depth, 8)
			p.read = reg.read
			var fs []*fakeFuture
			submit := func(msg string) {
				buf, err := pl.Get(len(msg))
				require.NoError(t, err)
				copy(buf.Bytes(), msg)
				require.NoError(t, buf.Ref()) // as Conn.post holds it
				wr, o, f := sendOpOf(verbs.OpWrite)
				wr.Flags |= verbs.SendInline
				o.Buf, o.N = buf, len(msg)
				q.Submit(&wr, verbs.SGE{Addr: buf.Addr(), Length: uint32(len(msg)), LKey: buf.LKey()}, &o)
				fs = append(fs, f)
				copy(buf.Bytes(), "XXXX") // the caller reuses its bytes at once
				require.NoError(t, buf.Release())
			}
			if tc.hold {
				q.postMu.Lock()
			}
			submit("ping")
			submit("pong")
			if tc.hold {
				require.Empty(t, p.chains, "left in the combining queue")
				q.postUnlock()
				require.Len(t, p.chains, 1, "one chain, one doorbell")
			} else {
				require.Len(t, p.chains, 1, "the first posted at its call, the second waits for room")
				completeWR(q, p.chains[0][0].ID)
				require.Len(t, p.chains, 2)
			}
			assert.Equal(t, []string{"ping", "pong"}, p.inline, "the bytes as they were at each call")
			wrs := p.wrs()
			completeWR(q, wrs[len(wrs)-1].ID)
			for i, f := range fs {
				assert.True(t, f.Resolved(), "future %d", i)
			}
			assert.Zero(t, pl.Stats().BuffersInUse, "the copies and the callers' buffers are back")
		})
	}
}

// An inline operation that must wait for room and whose bytes cannot be
// copied (the pool gives no buffer) fails at its call rather than be
// posted later from bytes its caller may have changed.
func TestSendQueueStageFails(t *testing.T) {
	reg := &memReg{}
	pl, err := pool.New(reg, pool.Options{})
	require.NoError(t, err)
	q, p := newSendQueue(t, 1, 8)
	bufs := make([]*pool.Buffer, 3)
	for i := range bufs {
		bufs[i], err = pl.Get(4)
		require.NoError(t, err)
	}
	submit := func(buf *pool.Buffer) *fakeFuture {
		require.NoError(t, buf.Ref())
		wr, o, f := sendOpOf(verbs.OpWrite)
		wr.Flags |= verbs.SendInline
		o.Buf, o.N = buf, 4
		q.Submit(&wr, verbs.SGE{Addr: buf.Addr(), Length: 4, LKey: buf.LKey()}, &o)
		return f
	}
	first := submit(bufs[0])
	second := submit(bufs[1]) // no room: it waits, from a copy
	require.False(t, second.Resolved())
	require.Error(t, pl.Close(), "buffers live") // Get fails from now on
	// No room, and no copy to be had:
	third := submit(bufs[2])
	require.True(t, third.Resolved())
	require.ErrorIs(t, third.Err(), pool.ErrClosed)
	completeWR(q, p.chains[0][0].ID)
	completeWR(q, p.chains[1][0].ID)
	assert.True(t, first.Resolved())
	assert.NoError(t, second.Err())
	assert.Len(t, p.chains, 2, "the third was never posted")
	for _, b := range bufs {
		assert.NoError(t, b.Release())
	}
	assert.Zero(t, pl.Stats().BuffersInUse)
}

// While coalesceAfter WRs or more are in flight, operations issued one
// by one wait, and go out as one chain (one doorbell, the bytes as
// they were at each call, one WR in signalEvery and the last signaled,
// the others resolved when a later completion covers them): with the
// operation that finds signalEvery waiting, with the first issued after a
// completion, or, when none is issued, with the completion that leaves
// fewer than coalesceAfter in flight. Fewer in flight, and one of more
// than coalesceMax bytes, go out at their call; a WR that is not inline
// joins as well, from its caller's buffer.
func TestSendQueueCoalesces(t *testing.T) {
	reg := &memReg{}
	pl, err := pool.New(reg, pool.Options{})
	require.NoError(t, err)
	defer pl.Close()
	q, p := newSendQueue(t, 2*coalesceChain, 2*coalesceChain)
	q.inline = 64
	p.read = reg.read
	var fs []*fakeFuture
	var want []string
	write := func(inline bool) {
		msg := fmt.Sprintf("%04d", len(fs))
		buf, err := pl.Get(len(msg))
		require.NoError(t, err)
		copy(buf.Bytes(), msg)
		require.NoError(t, buf.Ref()) // as Conn.post holds it
		wr, o, f := sendOpOf(verbs.OpWrite)
		if inline {
			wr.Flags |= verbs.SendInline
			want = append(want, msg)
		}
		o.Buf, o.N = buf, len(msg)
		q.Submit(&wr, verbs.SGE{Addr: buf.Addr(), Length: uint32(len(msg)), LKey: buf.LKey()}, &o)
		fs = append(fs, f)
		copy(buf.Bytes(), "XXXX") // the caller reuses its bytes at once
		require.NoError(t, buf.Release())
	}
	signaled := func(chain []verbs.SendWR) (s []int) {
		for i, wr := range chain {
			if wr.Flags&verbs.SendSignaled != 0 {
				s = append(s, i)
			}
		}
		return s
	}
	for range coalesceAfter {
		write(true)
	}
	require.Len(t, p.chains, coalesceAfter, "fewer than coalesceAfter in flight: each at its call")

	// coalesceChain waiting: the next one posts them and itself.
	for range coalesceChain {
		write(true)
	}
	require.Len(t, p.chains, coalesceAfter, "coalescing: no doorbell")
	assert.Zero(t, q.Counts().QueueWaits+q.Counts().CreditWaits, "coalescing is no wait for room or credits")
	write(true)
	require.Len(t, p.chains, coalesceAfter+1)
	chain := p.chains[coalesceAfter]
	require.Len(t, chain, coalesceChain+1, "one chain: those waiting and the one that found them")
	var every []int
	for i := signalEvery - 1; i < coalesceChain; i += signalEvery {
		every = append(every, i)
	}
	assert.Equal(t, append(every, coalesceChain), signaled(chain), "one in signalEvery, and the last")

	// More than coalesceMax bytes: posted at its call.
	big, o, f := sendOpOf(verbs.OpWrite)
	o.N = coalesceMax + 1
	q.Submit(&big, verbs.SGE{Addr: 4096, Length: coalesceMax + 1, LKey: 7}, &o)
	fs = append(fs, f)
	require.Len(t, p.chains, coalesceAfter+2, "a big one: posted at its call")

	// A completion came: the next one posts those waiting and itself.
	// One not inline waits too, from its caller's buffer.
	write(false)
	for range 3 {
		write(true)
	}
	completeWR(q, p.chains[0][0].ID)
	require.Len(t, p.chains, coalesceAfter+2, "still coalesceAfter in flight: the completion posts nothing")
	write(true)
	require.Len(t, p.chains, coalesceAfter+3)
	chain = p.chains[coalesceAfter+2]
	require.Len(t, chain, 5)
	assert.Equal(t, []int{4}, signaled(chain))
	assert.Zero(t, chain[0].Flags&verbs.SendInline, "not inline")
	assert.False(t, fs[len(fs)-5].Resolved(), "unsignaled: resolved when a later completion covers it")

	// None issued: the completions post them once fewer than
	// coalesceAfter are in flight.
	write(true)
	write(true)
	n := len(p.chains)
	for _, c := range p.chains[1:n] {
		completeWR(q, c[len(c)-1].ID)
	}
	require.Len(t, p.chains, n+1)
	require.Len(t, p.chains[n], 2)
	completeWR(q, p.chains[n][1].ID)

	assert.Equal(t, want, p.inline, "the bytes as they were at each call")
	for i, f := range fs {
		assert.True(t, f.Resolved(), "future %d", i)
		assert.NoError(t, f.Err(), "future %d", i)
	}
	assert.Zero(t, q.sent.len())
	assert.Zero(t, q.pending.Len())
	assert.Zero(t, pl.Stats().BuffersInUse, "the copies and the callers' buffers are back")
}

// A coalescing chain takes no more operations than the send queue has
// room for: the one past the room waits for room, counted as such, and
// the chain goes out without it.
func TestSendQueueCoalescesWithinRoom(t *testing.T) {
	q, p := newSendQueue(t, coalesceAfter+4, 64)
	for range coalesceAfter {
		issue(q, verbs.OpWrite)
	}
	require.Len(t, p.chains, coalesceAfter)
	for range 4 {
		issue(q, verbs.OpWrite)
	}
	require.Len(t, p.chains, coalesceAfter, "4 coalesce, within the room")
	last := issue(q, verbs.OpWrite)
	require.Len(t, p.chains, coalesceAfter+1, "the chain goes out without the one past the room")
	assert.Len(t, p.chains[coalesceAfter], 4)
	assert.Equal(t, 1, q.pending.Len())
	assert.Equal(t, uint64(1), q.Counts().QueueWaits)
	completeWR(q, p.chains[0][0].ID)
	require.Len(t, p.chains, coalesceAfter+2)
	for _, c := range p.chains[1:] {
		completeWR(q, c[len(c)-1].ID)
	}
	assert.True(t, last.Resolved())
	assert.Zero(t, q.sent.len())
}
