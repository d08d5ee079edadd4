package rdma_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// Rule: each kind of failure a user meets has a sentinel, and the error
// says what failed: a released buffer, the pool limit, a closed
// connection (which names itself and still matches net.ErrClosed).
func TestErrorSentinels(t *testing.T) {
	e, err := rdma.OpenEngine(rdma.WithProvider(rdma.ProviderSoft), rdma.WithPoolLimit(4<<20))
	require.NoError(t, err)
	defer e.Close()
	b, err := e.Alloc(64)
	require.NoError(t, err)
	require.NoError(t, b.Release())
	require.ErrorIs(t, b.Release(), rdma.ErrBufferReleased)

	_, err = e.Alloc(8 << 20)
	require.ErrorIs(t, err, rdma.ErrPoolLimit)
	assert.NotContains(t, err.Error(), "Options.MaxBytes", "the error names an option the user never set")

	c, s := pair(t, rdma.WithProvider(rdma.ProviderSoft))
	buf, err := c.Alloc(8)
	require.NoError(t, err)
	defer buf.Release()
	require.NoError(t, c.Close())
	defer s.Close()
	err = c.Send(buf).Err()
	require.ErrorIs(t, err, net.ErrClosed)
	require.ErrorIs(t, err, rdma.ErrClosed)
	assert.Contains(t, err.Error(), c.RemoteAddr().String(), "which connection")
}

// Rule: Dialer.Timeout bounds a dial as net.Dialer's does: a listener
// that never answers the handshake ends the dial with an error matching
// context.DeadlineExceeded, in about the timeout.
func TestDialerTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // silent: never answers
		}
	}()
	d := rdma.Dialer{Options: []rdma.Option{rdma.WithProvider(rdma.ProviderSoft)}, Timeout: 200 * time.Millisecond}
	start := time.Now()
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	require.Error(t, err)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), 5*time.Second)

	d.Timeout = -time.Second
	_, err = d.DialContext(context.Background(), "rdma", ln.Addr().String())
	require.ErrorIs(t, err, rdma.ErrInvalid)
}
