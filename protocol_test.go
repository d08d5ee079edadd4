package rdma_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// Rule: a dialer and a listener connect only when they name the same
// application protocol (or none); a mismatch fails the dial with
// ErrRefused naming both, and the listener goes on serving.
func TestProtocolMismatch(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithProtocol("kv/2"))
	require.NoError(t, err)
	defer ln.Close()
	addr := ln.Addr().String()
	for _, tc := range []struct {
		name string
		opts []rdma.Option
		want string
	}{
		{"other version", []rdma.Option{rdma.WithProtocol("kv/1")}, `the dialer speaks protocol "kv/1", this listener protocol "kv/2"`},
		{"no protocol", nil, `the dialer speaks the plain async API (no protocol), this listener protocol "kv/2"`},
	} {
		_, err := rdma.Dial(ctx, "rdma", addr, append([]rdma.Option{soft}, tc.opts...)...)
		require.ErrorIs(t, err, rdma.ErrRefused, tc.name)
		assert.Contains(t, err.Error(), strconv.Quote(tc.want), tc.name)
		// Said once, in the words a refusal over rdma_cm uses too.
		assert.Equal(t, "dial rdma "+addr+": rdma: "+rdma.ErrRefused.Error()+": the listener says: "+strconv.Quote(tc.want), err.Error(), tc.name)
	}
	// The same protocol connects, and each side's windows agree.
	c, s := connectPair(t, ctx, ln, soft, rdma.WithProtocol("kv/2"))
	assert.Equal(t, s.RecvWindow(), c.SendWindow())
	assert.Equal(t, c.RecvWindow(), s.SendWindow())
	send, recv := c.QueueDepth()
	assert.Equal(t, 128, send)
	assert.Equal(t, 64, recv)
	assert.Greater(t, c.RecvWindow(), 0)
	assert.LessOrEqual(t, c.RecvWindow(), recv)

	// A plain listener refuses a dialer that names a protocol.
	plain, err := rdma.Listen("rdma", "127.0.0.1:0", soft)
	require.NoError(t, err)
	defer plain.Close()
	_, err = rdma.Dial(ctx, "rdma", plain.Addr().String(), soft, rdma.WithProtocol("kv/2"))
	require.ErrorIs(t, err, rdma.ErrRefused)
	assert.Contains(t, err.Error(), strconv.Quote(`the dialer speaks protocol "kv/2", this listener the plain async API (no protocol)`))
}

func connectPair(t *testing.T, ctx context.Context, ln *rdma.Listener, opts ...rdma.Option) (c, s *rdma.Conn) {
	t.Helper()
	acc := make(chan *rdma.Conn, 1)
	go func() { s, _ := ln.Accept(ctx); acc <- s }()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s = <-acc
	require.NotNil(t, s)
	t.Cleanup(func() { s.Close() })
	return c, s
}

// Rule: WithProtocol refuses names it cannot carry.
func TestProtocolOption(t *testing.T) {
	soft := rdma.WithProvider(rdma.ProviderSoft)
	for _, name := range []string{"", strings.Repeat("x", 33), "has space", "nul\x00"} {
		_, err := rdma.Listen("rdma", "127.0.0.1:0", soft, rdma.WithProtocol(name))
		assert.ErrorIs(t, err, rdma.ErrInvalid, "%q", name)
	}
}
