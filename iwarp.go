package rdma

import (
	"context"
	"fmt"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/rc"
	"github.com/go-rdma/rdma/internal/verbs"
)

// iwarpSettleRetry is how long a dialer on iWARP waits for the answer to
// its settling READ before it sends another (settleIWARP).
const iwarpSettleRetry = 250 * time.Millisecond

// iwarpSettle is what a connection on iWARP keeps for settleIWARP: a
// listener's byte its dialer READs, and a dialer's view of it.
type iwarpSettle struct {
	buf  ieng.Cell    // the listener's byte: the first of buf.mem
	mr   verbs.MR     // its registration: REMOTE_READ of that byte alone
	peer RemoteRegion // the dialer's: the listener's byte; Len 0 if it named none

}

// iwarp reports whether the connection's device is iWARP's.
func (c *conn) iwarp() bool { return c.eng.Ctx.Info().Transport == "iWARP" }

// On iWARP the dialer must speak first: MPA lets the listener send only
// once the dialer's first frame has come (RFC 5044), and siw enforces it
// hard: a frame of the listener's that reaches the dialer's socket before
// the dialer has read the MPA reply's private data fails the dialer's
// connect (siw_recv_mpa_rr: "peer sent extra data", EPROTO), which
// rdma_cm reports as RDMA_CM_EVENT_CONNECT_ERROR, EINVAL. A stream's
// listener says hello at once, and a dial failed so about once a VM run.
// So a go-rdma dialer on iWARP says it goes first (cmFlagGoFirst); a
// go-rdma listener answers with its settle byte, holds its sends from
// the accept on (they queue, as for room), and lets them go when the
// dialer's first message, a zero-length SEND (the go), arrives; the
// dialer sends the go before anything else (settleIWARP).

// awaitGo makes a listener's connection wait for the dialer's go before
// it sends (Receiver.AwaitGo), for at most the handshake's bound.
func (c *conn) awaitGo() { c.rc.RQ.AwaitGo(c.cfg.setup) }

// sendGo sends the dialer's go: a zero-length SEND, before anything
// else, when the listener is go-rdma's (it named a settle byte).
func (c *conn) sendGo() error {
	if c.iw.peer.Len == 0 {
		return nil
	}
	pb, err := c.eng.Pool.Get(1) // the op holds a buffer, as every op does
	if err != nil {
		return fmt.Errorf("rdma: the go on iWARP: %w", err)
	}
	defer pb.Release()
	c.rc.Counters.Issued(verbs.OpSend, 0)
	f := c.post(&rc.Op{Kind: rc.OpSend, Buf: pb}, &verbs.SendWR{Opcode: verbs.OpSend, Flags: verbs.SendSignaled})
	if f.Resolved() {
		if err := f.Err(); err != nil {
			return err
		}
	}
	f.Release() // a failure fails the connection, and the settling READ with it
	return nil
}

// named keeps the byte the listener named in its accept hello, for the
// dialer's settling READ.
func (s *iwarpSettle) named(r RemoteRegion) { s.peer = r }

// settleIWARP makes sure the peer of a new iWARP connection reads what
// this side sends, before Dial returns it.
//
// Linux's siw (6.1 and later) sends the MPA reply before it gives the
// accepted socket to the queue pair (siw_accept): a message that arrives
// in between finds the connection manager's callback, which ignores it,
// and stays unread in the socket until the next segment arrives. A
// dialer that sends one request and waits for the answer then waits for
// ever. So the dialer, which speaks first on iWARP (MPA), posts an RDMA
// READ, which takes no receive, and waits for its answer; while none
// comes it posts another every iwarpSettleRetry, whose arrival makes the
// peer read what it holds. Once a READ is answered the peer reads every
// later message. Only READs: siw completes a WRITE as soon as it is
// sent, before a READ posted earlier is answered, and the first READ's
// answer must be the proof. At most readDepth (the negotiated ORD) are
// outstanding; a peer that grants no READs gets none, as a READ beyond
// the ORD fails the connection.
//
// The READ is of the byte a go-rdma listener names in its hello
// (offerSettleByte), and of zero bytes from another listener: siw
// answers a zero-length READ that arrives while it is sending from its
// queue of READs to answer, and there it reuses the scatter entry its
// last send left (siw_activate_tx), so the answer fails with an invalid
// STag and siw ends the connection with a TERMINATE. A go-rdma listener
// sends at once (a stream's hello) and hit it in one dial in ten.
func (c *conn) settleIWARP(ctx context.Context, readDepth int) error {
	if !c.iwarp() {
		return nil
	}
	if err := c.sendGo(); err != nil {
		return err
	}
	if readDepth == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.setup)
	defer cancel()
	first, n := c.readSettle(), 1
	tick := time.NewTicker(iwarpSettleRetry)
	defer tick.Stop()
	for {
		select {
		case <-first.Done():
			err := first.Err()
			first.Release()
			return err
		case <-tick.C:
			if n < readDepth {
				// Answered after the first: nothing waits for it.
				c.readSettle().Release()
				n++
			}
		case <-ctx.Done():
			return fmt.Errorf("rdma: peer %v: no answer to a settling READ after the rdma_cm connect: %w", c.rc.Remote, ctx.Err())
		}
	}
}

// readSettle posts an RDMA READ of the peer's settle byte, or of zero
// bytes when it named none.
func (c *conn) readSettle() *Future {
	pb, err := c.eng.Pool.Get(1) // the op holds a buffer, as every op does
	if err != nil {
		return newResolved(fmt.Errorf("rdma: %v: %w", verbs.OpRead, err))
	}
	defer pb.Release()
	r := c.iw.peer
	c.rc.Counters.Issued(verbs.OpRead, r.Len)
	return c.post(&rc.Op{Kind: rc.OpRead, Buf: pb, N: r.Len}, &verbs.SendWR{Opcode: verbs.OpRead, Flags: verbs.SendSignaled, RemoteAddr: r.Addr, RKey: r.RKey})
}

// offerSettleByte registers, on a listener's connection on iWARP, the
// byte its dialer READs (settleIWARP), for REMOTE_READ alone, until the
// connection closes; it holds zero. It returns the byte's region, or a
// zero one elsewhere.
func (c *conn) offerSettleByte() (RemoteRegion, error) {
	if !c.iwarp() {
		return RemoteRegion{}, nil
	}
	b, err := c.eng.Cells.Get(c.eng.PD)
	if err != nil {
		return RemoteRegion{}, fmt.Errorf("rdma: settle byte: %w", err)
	}
	mr, err := c.eng.PD.RegMR(b.Mem[:1], verbs.AccessRemoteRead)
	if err != nil {
		c.eng.Cells.Put(b)
		return RemoteRegion{}, fmt.Errorf("rdma: register the settle byte: %w", err)
	}
	c.iw.buf, c.iw.mr = b, mr
	return RemoteRegion{Addr: mr.Addr(), Len: 1, RKey: mr.RKey()}, nil
}

// closeSettleByte deregisters the settle byte; the QP is closed.
func (c *conn) closeSettleByte() error {
	c.rc.RQ.StopGo()
	if c.iw.mr == nil {
		return nil
	}
	err := c.iw.mr.Close()
	c.iw.mr = nil
	c.eng.Cells.Put(c.iw.buf)
	return err
}
