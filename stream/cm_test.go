package stream_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// Rule: a stream over an rdma_cm set-up, which has no credits and so no
// receive window, fails at the dial with ErrNotSupported saying so, not
// with a misleading error about queue depths. In the VM harness only,
// which sets RDMA_VM_IP0.
func TestStreamRDMACMNotSupported(t *testing.T) {
	ip0 := os.Getenv("RDMA_VM_IP0")
	if ip0 == "" {
		if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
			t.Fatal("RDMA_VM_IP0 unset")
		}
		t.Skip("rdma_cm tests run in the VM harness, which sets RDMA_VM_IP0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := stream.Listen("rdma", ip0+":0", rdma.WithRDMACM())
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := stream.Dial(ctx, "rdma", ln.Addr().String(), rdma.WithRDMACM())
	if c != nil {
		c.Close()
	}
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	assert.Contains(t, err.Error(), "no receive window")
}
