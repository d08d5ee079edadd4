package rdma

// Close closes the connection gracefully and returns every buffer it
// holds. What it promises to both sides:
//   - Every operation this side issued before Close completes as it
//     would have: Close first waits (up to 5 s) for them. Operations
//     still queued for room or credits go out as the peer makes room;
//     if it makes none for half a second (it does not read), they fail
//     with ErrClosed.
//   - The peer hears of the close, posts nothing more (its new and
//     pending operations and its Err give one error matching
//     ErrPeerClosed), and its operations in flight
//     complete too: Close keeps the queue pair up until the peer says
//     they are done (up to 2 s more). So a message that this side's Recv
//     took before Close counts as delivered on the sender's side, and a
//     READ or WRITE of the peer's into memory exposed here finishes
//     before the memory is deregistered.
//   - Messages that arrived and were not handed over yet (no Recv took
//     them; the RecvHandler was not called for them) are dropped;
//     pending Recvs and anything the bounds cut short fail with an error
//     wrapping net.ErrClosed (ErrClosed here, ErrPeerClosed on the
//     peer). A caller that closes once Done is closed drops nothing:
//     Done closes only after every message that arrived was handed
//     over. Done is closed when Close returns.
//
// On connections set up through rdma_cm the peer's operations are not
// waited for. Close is safe to call twice.
//
// On a connection that fell back to TCP (WithTCPFallback) Close closes
// the socket.
func (c *Conn) Close() error {
	if c.tcp != nil {
		return c.closeTCP(nil)
	}
	return c.rc.Close()
}
