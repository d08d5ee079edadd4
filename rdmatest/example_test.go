package rdmatest_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// upper is the code under test: a server that answers each message with
// the message in upper case, until its connection ends.
func upper(ctx context.Context, c *rdma.Conn) error {
	for {
		r := c.Recv()
		if err := r.Wait(ctx); err != nil {
			return err
		}
		in := r.Buffer()
		out, err := c.Alloc(in.Len())
		if err != nil {
			in.Release()
			return err
		}
		copy(out.Bytes(), bytes.ToUpper(in.Bytes()))
		in.Release()
		sent := c.Send(out)
		out.Release() // the send holds the memory until it completes
		if err := sent.Wait(ctx); err != nil {
			return err
		}
	}
}

// testUpper is the test of upper, TestUpper(t *testing.T) in a _test.go
// file of your own.
func testUpper(t testing.TB) {
	// The soft provider: the same test on machines with and without an
	// RDMA device.
	client, server := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- upper(ctx, server) }()

	b, err := client.Alloc(5)
	require.NoError(t, err)
	copy(b.Bytes(), "hello")
	answer := client.Recv()
	require.NoError(t, client.Send(b).Wait(ctx))
	require.NoError(t, b.Release())
	require.NoError(t, answer.Wait(ctx))
	got := string(answer.Buffer().Bytes())
	require.NoError(t, answer.Buffer().Release())
	require.Equal(t, "HELLO", got)
	t.Logf("hello -> %s", got)

	// The server ends when its client goes. (Pair closes both ends when
	// the test ends, had the test not closed one.)
	require.NoError(t, client.Close())
	require.ErrorIs(t, <-served, rdma.ErrPeerClosed)
}

func ExamplePair() {
	// go test calls TestUpper with its *testing.T; an example gets none,
	// so runExample stands in for go test, and prints what the test
	// logged.
	runExample(testUpper)
	// Output: hello -> HELLO
}
