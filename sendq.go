package rdma

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/rc"
)

// ErrQueueFull: the connection holds its WithSendQueueLimit of
// operations issued and not completed; the post failed at once.
var ErrQueueFull = rc.ErrQueueFull

// WithSendQueueLimit bounds the operations a connection holds issued and
// not completed, posted or waiting for room or credits (each operation
// of a Batch counts): by default 8 times the send depth, at least 4,096.
// n must be at least the send depth (WithQueueDepth), so that a Batch of
// the send depth fits an idle connection.
//
// A post past the limit fails at once with an error matching
// ErrQueueFull, and holds no buffer: nothing was posted or queued. The
// operations held go out as the send queue and the peer make room, so
// room comes back when one of them resolves: to wait for room, wait (under
// a context) on the Future of an earlier operation of the connection and
// post again. A peer that never reads holds the sender at the limit, and
// no more memory than that.
func WithSendQueueLimit(n int) ConnOption {
	return connOpt(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("rdma: %w: send queue limit %d (want at least the send depth)", ErrInvalid, n)
		}
		c.sqLimit = n
		return nil
	})
}

// sendQueueLimit is the connection's WithSendQueueLimit, or the default
// at its send depth.
func (c *config) sendQueueLimit() int {
	if c.sqLimit > 0 {
		return c.sqLimit
	}
	return rc.DefaultLimit(c.sqDepth)
}
