package rc

// Hooks for the tests of the packages above (rdma's exported test hooks):
// they play a hostile peer or a racing goroutine. Nothing else calls
// them.

// ForgeCredits gives the send queue n credits its peer never gave, as a
// hostile peer would take them.
func (q *SendQueue) ForgeCredits(n int) {
	q.postMu.Lock()
	q.credits += n
	q.postMu.Unlock()
}

// HoldPost takes postMu, as a goroutine posting at that moment would;
// posts meanwhile go to the combining queue. release lets go as a post
// does (postUnlock); bare only unlocks, leaving what the combining queue
// holds to the next holder, as a holder between its unlock and its
// second look does.
func (q *SendQueue) HoldPost() (release, bare func()) {
	q.postMu.Lock()
	return q.postUnlock, q.postMu.Unlock
}

// Credits reads the credit word and reports the credits the send queue
// holds.
func (q *SendQueue) Credits() int {
	q.postMu.Lock()
	defer q.postMu.Unlock()
	q.pullLocked()
	return q.credits
}

// IdleArmed reports whether the idle give-back of credits still runs.
func (q *SendQueue) IdleArmed() bool {
	q.postMu.Lock()
	defer q.postMu.Unlock()
	return q.idleArmed
}

// AwaitsVerdict reports whether the connection's completions wait for
// the control channel's word on why the peer went.
func AwaitsVerdict(c *Conn) bool { return c.vd.holding.Load() }
