package rdma_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/testchild"
	"github.com/go-rdma/rdma/rdmatest"
)

// orderlyEnd checks that err is the one error of a connection whose peer
// closed it in order, exactly, and returns its text with the peer's
// address masked, for comparing across connections.
func orderlyEnd(t *testing.T, s *rdma.Conn, err error, what string) string {
	t.Helper()
	want := fmt.Sprintf("rdma: peer %v: peer closed the connection", s.RemoteAddr())
	require.Error(t, err, what)
	assert.Equal(t, want, err.Error(), what)
	assert.ErrorIs(t, err, rdma.ErrPeerClosed, what)
	assert.NotErrorIs(t, err, rdma.ErrPeerLost, what)
	return strings.ReplaceAll(err.Error(), s.RemoteAddr().String(), "ADDR")
}

// Rule: the peer's orderly close reads as one error: the connection's
// Err, its pending Recvs, its Sends queued for credits and what it
// issues afterwards all fail with exactly "rdma: peer ADDR: peer closed
// the connection", which matches ErrPeerClosed and not ErrPeerLost and
// carries no completion status, in every round. (The Recvs used to say
// "... (work completion WR_FLUSH_ERR (wr_id ..., opcode RECV, ...))"
// and Err not.)
func TestPeerCloseOneError(t *testing.T) { eachProvider(t, testPeerCloseOneError) }

func testPeerCloseOneError(t *testing.T, opts []rdma.Option) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	texts := map[string]int{}
	for round := range 5 {
		c, s := rdmatest.Pair(t, append(opts, rdma.WithQueueDepth(128, 8))...)
		b, err := s.Alloc(8)
		require.NoError(t, err)
		recvs := []*rdma.Future{s.Recv(), s.Recv(), s.Recv()}
		// c takes none of these: past its 8 credits they wait.
		var sends []*rdma.Future
		for range 12 {
			sends = append(sends, s.Send(b))
		}
		require.NoError(t, c.Close())

		for i, f := range recvs {
			texts[orderlyEnd(t, s, f.Wait(ctx), fmt.Sprintf("round %d: pending Recv %d", round, i))]++
		}
		queued := 0
		for i, f := range sends {
			if err := f.Wait(ctx); err != nil {
				texts[orderlyEnd(t, s, err, fmt.Sprintf("round %d: Send %d", round, i))]++
				queued++
			}
		}
		require.NotZero(t, queued, "no Send waited for credits: the test proves nothing of them")
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("Done did not close after the peer's close")
		}
		texts[orderlyEnd(t, s, s.Err(), "Err")]++
		texts[orderlyEnd(t, s, s.Recv().Wait(ctx), "a Recv after the end")]++
		texts[orderlyEnd(t, s, s.Send(b).Wait(ctx), "a Send after the end")]++
		require.NoError(t, b.Release())
		require.NoError(t, s.Close())
	}
	assert.Len(t, texts, 1, "one text for the orderly close: %v", texts)
}

// Rule: a peer process that closes its connection and exits is an
// orderly close, told apart from a killed one (TestPeerKilled): the
// pending Recv, Err and Done say exactly the close's error.
func TestPeerExitAfterClose(t *testing.T) { eachProvider(t, testPeerExitAfterClose) }

func testPeerExitAfterClose(t *testing.T, opts []rdma.Option) {
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	texts := map[string]int{}
	for round := range 3 {
		child := testchild.Start(ctx, t, "closer", "RDMA_TEST_ADDR="+ln.Addr().String(), "RDMA_TEST_PROVIDER="+ln.Provider())
		c, err := ln.Accept(ctx)
		require.NoError(t, err)
		for range 3 {
			r := c.Recv()
			require.NoError(t, r.Wait(ctx), "receive from the child")
			require.NoError(t, r.Buffer().Release())
		}
		child.Expect(t, "ready")
		pending := c.Recv()
		_, err = fmt.Fprintln(child.Stdin(), "close")
		require.NoError(t, err)
		child.Expect(t, "closed")
		texts[orderlyEnd(t, c, pending.Wait(ctx), fmt.Sprintf("round %d: pending Recv", round))]++
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("Done did not close after the peer's close")
		}
		texts[orderlyEnd(t, c, c.Err(), fmt.Sprintf("round %d: Err", round))]++
		require.NoError(t, c.Close())
	}
	assert.Len(t, texts, 1, "one text for the orderly close: %v", texts)
}

// closerChild is the child of TestPeerExitAfterClose: it dials
// $RDMA_TEST_ADDR, sends three messages, says "ready", closes the
// connection when a line comes on stdin, says "closed" and exits.
func closerChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rdma.Dial(ctx, "rdma", os.Getenv("RDMA_TEST_ADDR"), rdma.WithProvider(os.Getenv("RDMA_TEST_PROVIDER")))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	b, err := c.Alloc(64)
	if err != nil {
		fmt.Println("alloc:", err)
		return 1
	}
	for range 3 {
		if err := c.Send(b).Wait(ctx); err != nil {
			fmt.Println("send:", err)
			return 1
		}
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Println("stdin:", err)
		return 1
	}
	b.Release()
	if err := c.Close(); err != nil {
		fmt.Println("close:", err)
		return 1
	}
	fmt.Println("closed")
	return 0
}
