package rdma

// The grants of credits to the peer are rc.Grants (c.cr); the sending
// half of the credits is the send queue's.

// recvCap is the credit cap this side announces in its hello: the most
// credits it can give the peer at once, its receive depth, or its SRQ's
// depth when that is smaller (every credit is backed by a posted
// receive).
func (c *conn) recvCap() int {
	if c.rc.SRQ != nil {
		return min(c.cfg.rqDepth, c.rc.SRQ.Depth())
	}
	return c.cfg.rqDepth
}
