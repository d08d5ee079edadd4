package rdma

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
)

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
