package rc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	ieng "github.com/go-rdma/rdma/internal/engine"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Conn is one reliable connection: its parts and their wiring. Each part
// owns its lock and its fields; Conn makes them, hands each the parts it
// needs, routes the engine's completions and the control channel's
// frames to them, and ends them: fail, close, teardown. It is the
// engine's Endpoint and the parts' Owner.
//
// Its exported fields are set while the connection is made (Init and the
// set-up: QP, Peer, CM) and read-only after; the parts change only
// through their methods.
type Conn struct {
	Ops      OpTable   // its WRs in flight, by wr_id
	Counters Counters  // what it issued and completed
	Grants   Grants    // the receiving half of the credits, and the credit word
	SQ       SendQueue // the only poster: room, combining, the sending half of the credits
	Life     Life      // the first error, the close, the peer's end, the WRs in flight
	RQ       Receiver  // the receive side
	Ctl      Control   // the control channel
	Regions  Regions   // the regions exposed, granted and requested
	QP       verbs.QP  // its queue pair
	Peer     Hello     // the peer's hello
	CM       CMID      // the rdma_cm connection; nil on TCP-set-up ones
	SRQ      *ieng.SRQ // where its receives come from; nil on rdma_cm connections
	Eng      *ieng.Engine
	Unit     *ieng.Unit     // its CQ and poller
	Drv      *poller.Poller // its poller when Busy: a Wait drives it
	Slot     ieng.Slot      // its place in the engine's table: the top of its wr_ids
	Inline   int            // bytes a SEND or WRITE may carry inline
	Remote   net.Addr

	cfg      Config
	shell    Shell
	gidIndex uint8           // the GID it speaks from (Prepare)
	ctx      context.Context // ends when the connection fails or closes
	cancel   context.CancelFunc
	done     chan struct{} // Done: ended, and every message that arrived delivered
	told     atomic.Bool   // the peer was told of a failure of our own (tellPeer)
	telling  sync.WaitGroup
	tellMu   sync.Mutex // orders telling.Add before teardown's Wait
	untold   bool       // teardown waits for the telling: start none; under tellMu
	vd       verdict    // completions waiting for the control channel's word

	quiesceOnce sync.Once
	closeOnce   sync.Once
	closeErr    error
}

// Config is what a connection is made with.
type Config struct {
	SendDepth, RecvDepth int
	SendLimit            int // operations held issued and not completed
	MaxMsg               int // the largest message it receives
	Handled              bool
	MaxExpose            int
	RegionLife           time.Duration
	CM                   bool          // set up through rdma_cm: its own receives, no credits
	Setup                time.Duration // the handshake's bound
	Protocol             string        // the application protocol its hello names
	// UC: the unreliable connected transport. Its own receives and no
	// credits, as through rdma_cm: a message the peer loses, or one
	// that finds no receive, is dropped there, and a credit spent on it
	// would never come back. No READ and no atomics.
	UC bool
}

// Shell is what the API layer does for a connection: count and log its
// start and its end, make the public error of a failed completion, run
// its RecvHandler (Handle, on the engine's workers), and, at the
// teardown, release what the API made for it and fold its counters
// into the engine's (Retire).
type Shell interface {
	ieng.Handler
	Connected()
	Ended(err error)
	CompletionError(wc *verbs.WorkCompletion) error
	Retire() error
}

// CMID is the rdma_cm connection's part in the end: its disconnect, and
// its id closed.
type CMID interface {
	Disconnect() error
	Close() error
}

// Init makes the connection on eng with its QP created (in RESET) and
// room reserved in a CQ for every WR it can have outstanding; ctrl is its
// control channel, nil through rdma_cm. On error nothing is left behind.
func (c *Conn) Init(eng *ieng.Engine, cfg Config, ctrl net.Conn, remote net.Addr, shell Shell) error {
	if err := eng.Acquire(); err != nil {
		return err
	}
	c.Eng, c.cfg, c.Remote, c.shell, c.done = eng, cfg, remote, shell, make(chan struct{})
	c.Life.Init(remote)
	shared := !cfg.CM && !cfg.UC // receives from the engine's SRQ, counted by credits
	credits := ctrl != nil && !cfg.UC
	c.RQ.Init(cfg.MaxMsg, shared, cfg.Handled, c.done, &c.Life, &c.Ops, &c.Grants, &c.SQ, c, eng.Pool)
	c.Ctl.Init(ctrl, MaxRegionRequests+8, &c.Life, c)
	slot, err := eng.AddEndpoint(c)
	if err != nil {
		eng.Release()
		return err
	}
	c.Slot = slot
	c.Ops.Init(slot.Base())
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.Regions.Init(c.ctx, &c.Life, &c.Ctl, &c.SQ, c, eng.Pool, eng.PD, cfg.MaxExpose, cfg.RegionLife)
	c.Grants.Init(cfg.RecvDepth, c.RQ.Mutex(), c.RQ.RecvCounter(), &c.Life, &c.SQ, &c.Peer, credits, c)
	c.SQ.Init(cfg.SendDepth, cfg.SendLimit, &c.Ops, &c.Life, c.Grants.Word(), &c.Peer, credits, c)
	if !credits {
		c.SQ.UnlimitedCredits()
	}
	if shared {
		// go-rdma's handshake receives through the shared receive
		// queue (its credits count its receives); rdma_cm
		// connections post their own.
		if err = eng.Lacks(verbs.FeatureSRQ); err != nil {
			err = fmt.Errorf("rdma: %w; connections WithRDMACM post their own receives", err)
		} else {
			c.SRQ, err = eng.SRQFor(cfg.MaxMsg, &c.Grants)
			c.Grants.SetSRQ(c.SRQ)
		}
	}
	if err == nil {
		c.Unit, err = eng.Reserve(c, c.cqNeed())
	}
	if err == nil {
		if eng.Cfg.PollMode == poller.Busy {
			c.Drv = c.Unit.P
		}
		qc := verbs.QPCap{MaxSendWR: cfg.SendDepth, MaxRecvWR: cfg.RecvDepth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}
		init := verbs.QPInit{Type: c.QPType(), SendCQ: c.Unit.CQ, RecvCQ: c.Unit.CQ, Cap: qc}
		if c.SRQ != nil {
			init.SRQ = c.SRQ.Q()
			init.Cap.MaxSendWR += ControlWRs
			init.Cap.MaxRecvWR, init.Cap.MaxRecvSGE = 0, 0
		}
		if c.QP, err = eng.PD.CreateQP(init); err != nil {
			err = fmt.Errorf("rdma: create QP: %w", err)
		} else if c.SRQ != nil {
			eng.RegisterQPN(c.QP.QPN(), c, c.Unit)
		}
	}
	if err != nil {
		c.Ctl.End()
		c.Teardown()
		return err
	}
	c.Inline = min(c.QP.Cap().MaxInlineData, 64)
	var kick *poller.Poller
	if eng.Cfg.PollMode == poller.Adaptive {
		// A parked Adaptive poller would wait for the completion
		// event; a kick after a post makes it spin for the
		// completion now. It costs nanoseconds otherwise. An Event
		// poller gets the event anyway: waking it to poll once would
		// only cost a wake and a park.
		kick = c.Unit.P
	}
	c.SQ.SetQP(c.QP, c.Inline, kick, c.Drv)
	c.RQ.SetQP(c.QP, c.Unit.P, cfg.RecvDepth)
	return nil
}

// QPType is the transport of the connection's QP: RC, or UC (Config.UC).
func (c *Conn) QPType() verbs.QPType {
	if c.cfg.UC {
		return verbs.UC
	}
	return verbs.RC
}

// cqNeed is the room the connection reserves in its CQ: a completion for
// every WR it can have outstanding. With an SRQ its receives are bounded
// by its credits (the receive depth), and the beacon and a credit WRITE
// take the send queue's room beyond the send depth.
func (c *Conn) cqNeed() int {
	if c.SRQ != nil {
		return c.cfg.SendDepth + c.cfg.RecvDepth + ControlWRs
	}
	return c.cfg.SendDepth + c.cfg.RecvDepth
}

// Context ends when the connection fails or closes.
func (c *Conn) Context() context.Context { return c.ctx }

// Done is closed when the connection has ended and every message that
// arrived before the end was handed over.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Shell is the API's side of the connection.
func (c *Conn) Shell() Shell { return c.shell }

// Fail records the first fatal error, moves the QP to the error state
// (every outstanding WR then completes with WR_FLUSH_ERR) and resolves
// the pending receives.
func (c *Conn) Fail(err error) {
	if !c.Life.Fail(err) {
		return
	}
	c.shell.Ended(err)
	c.cancel()
	if c.QP != nil {
		c.QP.ToError()
		c.postBeacon()
		if c.Eng.Lacks(verbs.FeatureFlushInError) != nil {
			time.AfterFunc(abandonAfter, c.abandonPosted)
		}
	}
	// Receives still posted complete (messages that arrived) or flush,
	// in order; the first flush fails the waiters left then (Receiver.OnRecv).
	// When nothing more can come, fail them now.
	c.RQ.Failed(err)
	c.Regions.FailRequests(err)
	c.SQ.FailPending()
	c.tellPeer(err)
}

// CutOff fails the connection and ends its control channel, so the
// peer sees its connection end too instead of waiting for answers: the
// failure tells the peer why (tellPeer), then ends the channel; a peer
// told already, or that ended it, is cut off here.
func (c *Conn) CutOff(err error) {
	c.Fail(err)
	if !c.told.Load() {
		c.Ctl.Conn().Close()
	}
}

// ProtocolErr cuts the peer off for breaking the control protocol.
func (c *Conn) ProtocolErr(format string, args ...any) {
	c.CutOff(fmt.Errorf("rdma: peer %v: %w: %s", c.Remote, ErrProtocol, fmt.Sprintf(format, args...)))
}

// Later runs job on the connection's control worker.
func (c *Conn) Later(job func()) { c.Ctl.Later(job) }

// WriteControl sends a control frame to the peer.
func (c *Conn) WriteControl(typ byte, p []byte) error { return c.Ctl.Write(typ, p) }

// Dispatch has the engine's workers run the connection's RecvHandler.
func (c *Conn) Dispatch() { c.Eng.Dispatch(c.shell) }

// closeAckBound is how long Close waits for the peer to say that its
// operations are done.
const closeAckBound = 2 * time.Second

// Close closes the connection in order (the API's Close says what it
// promises) and releases everything it holds. It runs once; it returns
// the teardown's error every time.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.Life.CallClose()
		// Let the operations in flight finish first (bounded): holding
		// every send credit means none is outstanding, and none can
		// start. A message we sent is then known to have arrived
		// before the peer hears that we close.
		if c.Life.Err() == nil {
			c.quiesce(fmt.Errorf("rdma: conn %v: %w", c.Remote, verbs.ErrClosed), true)
		}
		if c.Ctl.Conn() != nil && !c.told.Load() { // an abort told the peer already
			c.Ctl.WriteLast(CtrlClose, nil, time.Second)
			// Keep the QP up until the peer's operations are done too
			// (bounded): it acknowledges what it received only while
			// it is up, and the peer may still be reading from or
			// writing to our memory.
			select {
			case <-c.Ctl.CloseAcked():
			case <-c.Ctl.Done():
			case <-time.After(closeAckBound):
			}
		}
		if c.CM != nil {
			// Keep the QP in RTS until the peer has answered the
			// disconnect (bounded): moving it to ERR at once can drop
			// the ACK of the last message the peer sent us (rxe
			// completes a receive before it acknowledges it), and the
			// peer would then wait for its retries.
			c.CM.Disconnect()
			select {
			case <-c.Ctl.Done():
			case <-time.After(2 * time.Second):
			}
		}
		c.closeErr = c.Teardown()
	})
	return c.closeErr
}

// Teardown releases everything the connection holds, at once: the end
// of Close, and of a set-up that failed.
func (c *Conn) Teardown() error {
	c.Life.BeginTeardown()
	c.Fail(fmt.Errorf("rdma: conn %v: %w", c.Remote, verbs.ErrClosed))
	var errs []error
	if c.QP != nil {
		// The QP is in the error state: the outstanding WRs flush.
		var stopped <-chan struct{} // a stopped poller drains nothing
		if c.Unit != nil {
			stopped = c.Unit.P.Done()
		}
		select {
		case <-c.Life.Drained():
		case <-stopped:
		case <-time.After(5 * time.Second):
		}
		errs = append(errs, c.QP.Close())
		if c.SRQ != nil {
			// The beacon flushed (or the bounds above ran out): no
			// completion of the QP is left to reach the next user of
			// its QPN.
			c.Eng.UnregisterQPN(c.QP.QPN(), c)
		}
	}
	if mr := c.SQ.DetachCreditWord(); mr != nil {
		errs = append(errs, c.Grants.Word().Close(mr, &c.Eng.Cells))
	}
	if c.SRQ != nil {
		c.Grants.Leave()
		errs = append(errs, c.Eng.DropSRQ(c.SRQ))
	}
	c.SQ.ClearSent()
	// The QP is gone, so no completion can arrive for what is left:
	// resolve it here.
	c.resolveLeft()
	c.RQ.Drop(c.Life.ClosedErr())
	// The abort frame goes out before the socket closes. A failure
	// racing with this (a device event) starts no telling after it.
	c.tellMu.Lock()
	c.untold = true
	c.tellMu.Unlock()
	c.telling.Wait()
	if c.Ctl.Conn() != nil {
		c.Ctl.Conn().Close()
	}
	<-c.Ctl.Done()
	c.Ctl.WaitWorker()
	if c.CM != nil {
		errs = append(errs, c.CM.Close())
	}
	errs = append(errs, c.Regions.RevokeAll(), c.shell.Retire())
	if c.Unit != nil {
		c.Eng.Unreserve(c, c.Unit, c.cfg.SendDepth+c.cfg.RecvDepth)
	}
	errs = append(errs, c.Eng.Release())
	return errors.Join(errs...)
}

// MakeCreditWord registers the connection's credit word, through which
// the grants tell the peer the credits they give. Connections without a
// control channel (rdma_cm) have no credits.
func (c *Conn) MakeCreditWord() error {
	if c.Ctl.Conn() == nil || c.SRQ == nil {
		return nil
	}
	return c.Grants.Word().Register(&c.Eng.Cells, c.Eng.PD)
}

// postBeacon posts a WR to the QP, just moved to the error state, whose
// flush comes after the completion of every message that arrived before
// the error: a CQ reports a QP's completions in order, and in the error
// state the QP takes no more messages. When the flush is handled, every
// message that came is delivered, so the Recvs still waiting fail
// (Receiver.OnBeacon), and no completion of the QP is left in its CQ, so
// its QPN may go to another connection (Teardown).
func (c *Conn) postBeacon() {
	if c.SRQ != nil && !c.SQ.PostBeacon() {
		// Nothing to wait for (the QP is closed, or the provider
		// refuses): what came is all there is.
		c.RQ.OnBeacon(nil)
	}
}

// abandonAfter is how long after a failure a connection on a device
// that never completes WRs posted to a QP in ERR (siw) waits for the
// flushes of those it posted before giving up on the rest.
const abandonAfter = time.Second

// abandonPosted gives up on the WRs the device will never complete. On
// such a device a WR posted after the device moved the QP to ERR on its
// own (the peer's reset), before this side knew, waits for ever; the
// ones posted before were flushed when Fail moved the QP to ERR, and
// their completions are handled well within abandonAfter. So the Recvs
// still waiting fail now rather than at Close, and the operations left
// resolve with the connection's error; their buffers go back, as the
// device will not touch them.
func (c *Conn) abandonPosted() {
	c.RQ.Abandon()
	c.resolveLeft()
}
