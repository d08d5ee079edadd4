package rdma

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogLimiterBounded: keys an attacker chooses (a refusal's address
// and reason) neither grow the limiter past maxLogKeys nor the log past
// maxLogKeys records per interval, and what is held back is counted and
// reported with the next record logged.
func TestLogLimiterBounded(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	logged := 0
	for i := range 10000 {
		if ok, _, _ := l.allow(fmt.Sprintf("10.0.%d.%d bad hello", i/256, i%256), t0); ok {
			logged++
		}
		require.LessOrEqual(t, len(l.last), maxLogKeys)
	}
	assert.Equal(t, maxLogKeys, logged, "records in one interval")
	// A tracked key repeats within the interval: held back, counted.
	ok, _, _ := l.allow("10.0.0.0 bad hello", t0.Add(logEvery/2))
	assert.False(t, ok)
	// An interval later a new key is logged, with what was held back.
	ok, more, others := l.allow("10.9.9.9 bad hello", t0.Add(logEvery))
	require.True(t, ok)
	assert.Zero(t, more)
	assert.Equal(t, 10000-maxLogKeys+1, others, "held back: new keys, and the repeat of a forgotten one")
	ok, _, others = l.allow("10.9.9.8 bad hello", t0.Add(logEvery))
	require.True(t, ok)
	assert.Zero(t, others, "reported once")
}

// TestRefusalKey: refusals are told apart by the peer's host and reason,
// not by its port, and the key is bounded.
func TestRefusalKey(t *testing.T) {
	a := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5000}
	b := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 5001}
	c := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 2), Port: 5000}
	why := func(addr net.Addr) error { return fmt.Errorf("rdma: TLS handshake with %v: bad certificate", addr) }
	assert.Equal(t, refusalKey(a, why(a)), refusalKey(b, why(b)))
	assert.NotEqual(t, refusalKey(a, why(a)), refusalKey(c, why(c)))
	assert.NotEqual(t, refusalKey(a, why(a)), refusalKey(a, errors.New("no certificate")))
	assert.LessOrEqual(t, len(refusalKey(a, errors.New(string(make([]byte, 10000))))), maxRefusalKey)
}
