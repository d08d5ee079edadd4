package rdma

// This file holds what a protocol built on a Conn (the stream package,
// or one of the user's own) needs to know of its flow control: its
// queue depths and how many messages each side may have in flight
// without waiting for credits.

// QueueDepth is the connection's send queue depth (the most send WRs in
// flight) and receive depth (the credits it may give its peer), as
// WithQueueDepth set them.
func (c *Conn) QueueDepth() (send, recv int) { return c.cfg.sqDepth, c.cfg.rqDepth }

// QueueDepth is the send and receive depths of the connections the
// listener accepts (WithQueueDepth).
func (l *Listener) QueueDepth() (send, recv int) { return l.cfg.sqDepth, l.cfg.rqDepth }

// RecvWindow is how many messages the peer may have sent to this side
// that no Recv has taken yet and still never wait for a credit: the
// receives this side backs with credits (its credit cap), less those
// whose credits it holds back to return in a batch. A protocol whose
// sender keeps at most RecvWindow messages unread by the receiver's Recv
// never stalls in the credit layer. It is told to the peer in the
// hello (SendWindow). Zero on connections set up through rdma_cm, which
// have no credits.
func (c *Conn) RecvWindow() int {
	if c.cm != nil {
		return 0
	}
	return max(0, c.recvCap()-int(c.creditBatch())+1)
}

// SendWindow is the peer's RecvWindow, as its hello said: how many
// messages this side may have sent that the peer's Recv has not taken
// yet without ever waiting for a credit. Zero on connections set up
// through rdma_cm, where the peer's receives are not known.
func (c *Conn) SendWindow() int { return int(c.peer.RecvWindow) }
