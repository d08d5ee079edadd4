package rdma

import (
	"fmt"
)

// Abort ends the connection at once for cause, and releases what it
// holds, as Close does. Unlike Close it does not wait for the operations
// in flight: they, the pending Recvs and the messages that no Recv took
// fail or are dropped, with an error wrapping ErrClosed and cause. The
// peer is told at once: its pending operations fail with ErrPeerClosed,
// and on connections set up over TCP the error's text says cause. Abort
// and Close after it return nil; cause must not be nil.
func (c *Conn) Abort(cause error) error {
	if cause == nil {
		return fmt.Errorf("rdma: conn %v: abort: %w: nil cause", c.rc.Remote, ErrInvalid)
	}
	if c.tcp != nil {
		return c.closeTCP(cause) // the socket is reset
	}
	c.rc.Fail(fmt.Errorf("rdma: conn %v: %w: aborted: %w", c.rc.Remote, ErrClosed, cause))
	return c.api.Close()
}
