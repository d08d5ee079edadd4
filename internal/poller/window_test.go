package poller

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSpinWindowFollowsWakeCost(t *testing.T) {
	least, most := spinBounds(0)
	require.Equal(t, int64(DefaultSpin), least)
	require.Equal(t, int64(MaxSpin), most)
	p := &Poller{spinMin: least, spinMax: most}
	var ls loopState
	us := func(n int) int64 { return int64(time.Duration(n) * time.Microsecond) }

	assert.Equal(t, least, p.window(&ls), "no wake measured yet: DefaultSpin")
	ls.wakeSample(us(20))
	assert.Equal(t, least, p.window(&ls), "a wake cheaper than half DefaultSpin")
	for range 40 {
		ls.wakeSample(us(60))
	}
	assert.InDelta(t, us(120), p.window(&ls), float64(us(5)), "twice the mean of dear wakes")
	for range 40 {
		ls.wakeSample(us(5000))
	}
	assert.Equal(t, most, p.window(&ls), "never beyond MaxSpin")
	for range 60 {
		ls.wakeSample(us(10))
	}
	assert.Equal(t, least, p.window(&ls), "back to DefaultSpin once wakes are cheap")
	ls.wakeSample(-5)
	ls.wakeSample(0)
	assert.Equal(t, least, p.window(&ls), "a clock step teaches nothing")

	least, most = spinBounds(30 * time.Microsecond)
	assert.Equal(t, least, most, "an explicit spin is the window")
}

// An Adaptive poller with the default spin measures its Kicks' wakes and
// spins that long; one with an explicit Spin does not.
func TestAdaptiveSpinsAsLongAsItsWakesCost(t *testing.T) {
	for _, tc := range []struct {
		name string
		spin time.Duration
		long bool
	}{
		{"default", 0, true},
		{"explicit", 20 * time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := newFakeChan()
			ch.blocked = make(chan struct{}, 1)
			ch.wakeDelay = 2 * MaxSpin
			p := mustNew(t, newFakeCQ(64, ch), ch, newCollector(1, 1), Config{Spin: tc.spin})
			waitOrFail(t, ch.blocked, "poller parks", p)
			const kicks = 3
			for i := range kicks {
				p.Kick()
				waitOrFail(t, ch.blocked, "poller parks again after the kick", p)
				require.Equal(t, uint64(i+1), p.Stats().Wakeups)
			}
			s := p.Stats()
			if tc.long {
				// Each wake took twice MaxSpin: after the first, every
				// spin is MaxSpin long (none is cut: nothing else runs).
				assert.Equal(t, uint64(kicks), s.LongSpins, "%+v", s)
			} else {
				assert.Zero(t, s.LongSpins, "%+v", s)
			}
		})
	}
}
