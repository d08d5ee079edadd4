package loglimit

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogLimiterBounded: keys an attacker chooses (a refusal's address
// and reason) neither grow the limiter past MaxKeys nor the log past
// MaxKeys records per interval, and what is held back is counted and
// reported with the next record logged.
func TestLogLimiterBounded(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	logged := 0
	for i := range 10000 {
		if ok, _, _ := l.Allow(fmt.Sprintf("10.0.%d.%d bad hello", i/256, i%256), t0); ok {
			logged++
		}
		require.LessOrEqual(t, len(l.last), MaxKeys)
	}
	assert.Equal(t, MaxKeys, logged, "records in one interval")
	// A tracked key repeats within the interval: held back, counted.
	ok, _, _ := l.Allow("10.0.0.0 bad hello", t0.Add(Every/2))
	assert.False(t, ok)
	// An interval later a new key is logged, with what was held back.
	ok, more, others := l.Allow("10.9.9.9 bad hello", t0.Add(Every))
	require.True(t, ok)
	assert.Zero(t, more)
	assert.Equal(t, 10000-MaxKeys+1, others, "held back: new keys, and the repeat of a forgotten one")
	ok, _, others = l.Allow("10.9.9.8 bad hello", t0.Add(Every))
	require.True(t, ok)
	assert.Zero(t, others, "reported once")
}
