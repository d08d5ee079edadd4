package rc

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAskCountsRacingGrants: a peer's ask counts the credits given that
// the peer had not seen when it asked. Counted outside the SRQ's lock, a
// grant to the connection's waiting record between the count and the
// ask was given twice: once to the record, and once more to the ask that
// replaced it, net of too little. The connection then held credits for
// messages it no longer had, neither spare nor waiting, so no targeted
// recall got them back (TestBurstManyConns: the last 1% of a
// 1,000-connection burst finished up to 1.4 s late).
//
// a waits for want credits while b holds the whole queue; then a asks
// the same again (as a sender does after a recall) while b gives its
// credits back, which serves a. Whatever the order, a is given want in
// all, less what its record still waits for.
func TestAskCountsRacingGrants(t *testing.T) {
	const depth, want, rounds = 16, 8, 20000
	e := propEngine(t)
	r := newPropRig(t, e, depth, newPropSeeded(1), nil, nil)
	// No credit word: grants answer in frames, on a job of the control
	// worker this test never runs, so the two sides share no slice.
	a := r.joinWord(depth, true, false)
	b := r.joinWord(depth, true, false)
	for i := range rounds {
		b.g.OnAsk(depth, b.g.Given(), 1, 1)
		require.EqualValues(t, depth, b.g.Out(), "round %d: b, alone, is given the whole queue", i)
		seen := a.g.Given()
		a.g.OnAsk(want, seen, 1, 1)
		_, waits := r.s.Waiting(&a.g)
		require.True(t, waits, "round %d: a waits for b's credits", i)

		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; a.g.OnAsk(want, seen, 1, 1) })
		wg.Go(func() { <-start; b.g.OnBack(depth) })
		close(start)
		wg.Wait()

		rec, _ := r.s.Waiting(&a.g)
		given := int(a.g.Given() - seen)
		require.Equal(t, want, given+rec, "round %d: a asked for %d; given %d, and its record waits for %d", i, want, given, rec)
		a.g.OnBack(uint32(a.g.Out()))
	}
}
