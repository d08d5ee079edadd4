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
// that no Recv has taken yet and still find a receive for the next one
// at once: the receives this side keeps for the connection (its credit
// cap), less those it re-posts, or whose credits it returns, in a
// batch. A protocol whose sender keeps at most RecvWindow messages
// unread by the receiver's Recv never waits for a credit, and, on a
// connection without credits (Credited), never sends into an empty
// receive queue. It is told to the peer in the hello (SendWindow).
func (c *Conn) RecvWindow() int { return c.rc.RecvWindow() }

// SendWindow is the peer's RecvWindow, as its hello said: how many
// messages this side may have sent that the peer's Recv has not taken
// yet and still never wait for a receive. Zero when the peer did not say
// (an rdma_cm peer that is not go-rdma, or of a version before v0.2.0).
func (c *Conn) SendWindow() int { return int(c.rc.Peer.RecvWindow) }

// Credited reports whether the connection sends a message only when the
// peer has a receive for it (credits, the default): a sender that
// outruns the peer's Recv waits behind its Future. Connections set up
// through rdma_cm (WithRDMACM) have no credits: there a protocol keeps
// at most SendWindow messages unread by the peer, or a message may find
// no receive, which the device retries (RNR) or, on iWARP, which has no
// RNR retry, ends the connection. UC connections (WithTransport) have
// none either, and there such a message is dropped.
func (c *Conn) Credited() bool { return c.rc.CM == nil && c.cfg.transport == RC }
