package rc

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Control is a connection's control channel: the TCP connection its
// handshake ran on, kept open for the frames of the control protocol
// (WriteFrame, ReadFrame), one writer at a time; the worker that runs control work
// off the reader (Later); and the marks of the close handshake. The
// reader, which dispatches each frame to the part it is for, is the
// connection's.
type Control struct {
	conn net.Conn   // nil on rdma_cm connections
	mu   sync.Mutex // serializes frames
	done chan struct{}

	jobs    chan func() // control work, run by one worker (Later)
	working atomic.Bool
	workers sync.WaitGroup

	heard        chan struct{} // closed when the peer's close came (HearClose)
	closeAck     chan struct{} // closed when the peer answers our close (AckClose)
	closeAckOnce sync.Once
	frames       atomic.Uint64                 // frames written
	deaf         atomic.Bool                   // tests: play a peer that reads its control frames and drops them
	slow         atomic.Pointer[chan struct{}] // tests: the reader waits for it to close before each frame

	life    *Life
	owner   Owner
	pongDue atomic.Bool // a CtrlPong is queued: pings meanwhile share it
}

// writeBound is how long a frame may take to go out. Frames are tiny,
// so the socket buffer takes them at once; a write that times out means
// a stuck peer.
const writeBound = 10 * time.Second

// Init makes the control channel over conn, nil on rdma_cm connections,
// with room for jobs jobs queued: the protocol's bounds.
func (c *Control) Init(conn net.Conn, jobs int, life *Life, owner Owner) {
	c.conn, c.life, c.owner = conn, life, owner
	c.done, c.closeAck, c.heard = make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.jobs = make(chan func(), jobs)
}

// Conn is the TCP connection, nil on rdma_cm connections.
func (c *Control) Conn() net.Conn { return c.conn }

// Detach lets the TCP connection go before the set-up ends: the
// connection's teardown then neither writes to it nor closes it. The TCP
// fallback keeps it to carry the caller's bytes.
func (c *Control) Detach() { c.conn = nil }

// Write writes a frame, even on a failed connection (answers and the
// close handshake still go out while the socket is open). A frame cut in
// half would corrupt the channel, so a failed write fails the connection:
// with the peer's end when its socket is gone (reset, or a broken pipe),
// as the reader would have found it, else with the write's error.
func (c *Control) Write(typ byte, p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(writeBound))
	c.frames.Add(1)
	if err := WriteFrame(c.conn, typ, p); err != nil {
		if c.life.Err() != nil {
			return c.life.ClosedErr()
		}
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			// The peer's socket is gone: its end, as the reader would
			// see it (a write may see it first).
			c.life.SetPeerClosed()
			err = fmt.Errorf("%w (%w)", c.life.PeerLostErr(), err)
			if c.life.CloseHeard() {
				err = c.life.PeerClosedErr()
			}
		} else {
			err = fmt.Errorf("rdma: control channel to %v: %w", c.life.remote, err)
		}
		c.owner.Fail(err)
		return err
	}
	return nil
}

// WriteLast writes a frame that ends the channel's use (a close, an
// abort), within d; its failure is the caller's to judge.
func (c *Control) WriteLast(typ byte, p []byte, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn.SetWriteDeadline(time.Now().Add(d))
	c.frames.Add(1)
	return WriteFrame(c.conn, typ, p)
}

// WriteRaw writes b as it is, as a hostile peer could (tests).
func (c *Control) WriteRaw(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.conn.Write(b)
	return err
}

// Frames is how many frames were written.
func (c *Control) Frames() uint64 { return c.frames.Load() }

// Later runs job on the control worker: one goroutine, made when there
// is work and gone when there is none. The queue is bounded by the
// protocol's limits; a peer that overflows it is cut off.
func (c *Control) Later(job func()) {
	select {
	case c.jobs <- job:
	default:
		c.owner.ProtocolErr("more control work queued than the protocol allows")
		return
	}
	if c.working.CompareAndSwap(false, true) {
		c.workers.Add(1)
		go c.work()
	}
}

// Pong answers the peer's CtrlPing on the control worker. Pings that
// come while an answer is queued share it, so a peer's pings cost at
// most one queued job.
func (c *Control) Pong() {
	if c.pongDue.CompareAndSwap(false, true) {
		c.Later(func() {
			c.pongDue.Store(false)
			c.Write(CtrlPong, nil)
		})
	}
}

func (c *Control) work() {
	defer c.workers.Done()
	for {
		select {
		case f := <-c.jobs:
			f()
			continue
		default:
		}
		c.working.Store(false)
		// A job queued between the empty check and the store would be
		// left waiting: look once more.
		if len(c.jobs) == 0 || !c.working.CompareAndSwap(false, true) {
			return
		}
	}
}

// WaitWorker waits for the control worker to finish its work.
func (c *Control) WaitWorker() { c.workers.Wait() }

// End marks the reader ended: no frame is read any more.
func (c *Control) End() { close(c.done) }

// Done is closed when the reader ended.
func (c *Control) Done() <-chan struct{} { return c.done }

// HearClose marks the peer's close heard (after Life.HearClose).
func (c *Control) HearClose() { close(c.heard) }

// Heard is closed when the peer's close came.
func (c *Control) Heard() <-chan struct{} { return c.heard }

// AckClose marks our close answered by the peer.
func (c *Control) AckClose() { c.closeAckOnce.Do(func() { close(c.closeAck) }) }

// CloseAcked is closed when the peer answered our close.
func (c *Control) CloseAcked() <-chan struct{} { return c.closeAck }

// Deafen makes the reader drop every frame, as a hung or hostile peer
// would (tests).
func (c *Control) Deafen() { c.deaf.Store(true) }

// Deaf reports whether the reader drops every frame.
func (c *Control) Deaf() bool { return c.deaf.Load() }

// Slow makes the reader wait for ch to close before each frame (tests).
func (c *Control) Slow(ch chan struct{}) { c.slow.Store(&ch) }

// WaitSlow waits for the channel Slow set, if any.
func (c *Control) WaitSlow() {
	if slow := c.slow.Load(); slow != nil {
		<-*slow
	}
}
