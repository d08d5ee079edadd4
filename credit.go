package rdma

import (
	"encoding/binary"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Credits keep a connection's messages within the receives its peer has
// posted, so a peer that does not read slows its sender instead of
// making it retry receiver-not-ready (RNR) without end, which on rxe and
// hardware (rnr_retry 7) never gives up.
//
// The handshake's hello tells the sender how many receives the receiver
// keeps posted: its first credits. Each SEND, SEND_WITH_IMM and
// WRITE_WITH_IMM takes one; a message without a credit waits in the send
// queue's queue (sendq.go) behind an unresolved Future. The receiver
// returns credits as the application takes messages and their receives
// are posted again (a refill is an eighth of the depth), on the
// control channel. Connections set up through rdma_cm have no control
// channel, so they send without credits, as before.

// maxCredits bounds the credits a peer can give, so adding never
// overflows.
const maxCredits = 1 << 30

// needCredits counts the WRs of wrs that take a receive at the peer.
func needCredits(wrs []verbs.SendWR) int {
	n := 0
	for i := range wrs {
		switch wrs[i].Opcode {
		case verbs.OpSend, verbs.OpSendWithImm, verbs.OpWriteWithImm:
			n++
		}
	}
	return n
}

// roomLocked reports whether wrs fit the send queue and the credits.
// Caller holds postMu.
func (c *Conn) roomLocked(wrs []verbs.SendWR) bool {
	return c.sqFree >= len(wrs) && c.credits >= needCredits(wrs)
}

// onCredit takes credits the peer returned and posts what waited for
// them.
func (c *Conn) onCredit(n int) {
	c.postMu.Lock()
	c.credits = min(c.credits+n, maxCredits)
	c.drainLocked()
	c.postUnlock()
}

// owe records n receives posted again for the peer's messages; the
// control worker tells the peer, one frame for all owed by the time it
// runs. It runs under rmu, on a poller or in Recv, so it never writes
// itself.
//
// Credits go back as soon as receives are posted again (a refill is an
// eighth of the depth). Holding them back to send fewer frames
// deadlocked a stream carrying HTTP: the receiver, which had taken its
// messages but not the stream's data, waited to write its answer, while
// the sender waited for the credits. Each frame costs a wake, a write and
// a read: about a quarter of the CPU of 64-byte messages
// (docs/connections.md); credits carried in band are the plan.
func (c *Conn) owe(n int) {
	if n <= 0 || c.ctrl == nil {
		return
	}
	c.creditOwed.Add(int64(n))
	if !c.creditQueued.Swap(true) {
		c.later(c.returnCreditsJob)
	}
}

func (c *Conn) returnCredits() {
	c.creditQueued.Store(false)
	if n := c.creditOwed.Swap(0); n > 0 {
		c.writeControl(ctrlCredit, binary.BigEndian.AppendUint32(nil, uint32(n)))
	}
}
