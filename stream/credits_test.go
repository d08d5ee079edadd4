package stream_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// A stream's ping-pong returns its message credits in batches of an
// eighth of its receive window, each an RDMA WRITE that its reader posts
// on the way to its reply: on rxe a system call ahead of the reply. With
// a window of 32 one message in 4 paid one (the stream's Adaptive
// round trip on rxe measured 42-45 % longer, typical, than with 128;
// docs/performance.md); with the default window, at most one in 16.
func TestStreamPingPongCreditWrites(t *testing.T) {
	eachTCPSetup(t, func(t *testing.T, opts []rdma.Option) {
		c, s := streamPair(t, opts...)
		require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
		require.NoError(t, s.SetDeadline(time.Now().Add(30*time.Second)))
		const rounds = 256
		done := echo(s, 64, rounds)
		msg, got := make([]byte, 64), make([]byte, 64)
		for i := range rounds {
			msg[0] = byte(i)
			_, err := c.Write(msg)
			require.NoError(t, err)
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			require.Equal(t, msg, got)
		}
		require.NoError(t, <-done)
		for side, conn := range map[string]*rdma.Conn{"client": c.RDMAConn(), "server": s.RDMAConn()} {
			w := conn.Stats().CreditWrites
			assert.LessOrEqual(t, w, uint64(rounds/16+2), "%s: credit WRITEs for %d messages taken", side, rounds)
		}
	})
}
