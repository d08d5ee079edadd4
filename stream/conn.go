package stream

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/go-rdma/rdma"
)

// Conn is a byte stream over an RDMA connection: a net.Conn with the
// whole of its contract (concurrent use, Close unblocking pending calls,
// deadlines, io.EOF only on the peer's orderly close, *net.OpError
// errors). Dial and Listener.Accept return it.
//
// Data moves as SENDs of up to MaxMessage bytes into the receives of the
// peer's engine, with credit-based flow control (see frame.go): a writer
// has at most a window of messages in flight that the reader has not
// consumed (the peer's rdma.Conn.SendWindow less a reserve of 6 for
// messages that are not data: 23 with the default receive depth of 32),
// and blocks when it has used them, so a slow reader holds the writer
// back and no memory grows. Credits come back in batches of a quarter of
// the window, or ride on data going the other way.
//
// Memory per connection, with the stream defaults (receive depth 32,
// MaxMessage 64 KiB): at most 23 received messages of up to 64 KiB
// waiting for Read, and at most 23 being sent; all of it registered
// memory from the engine's pool, set by WithQueueDepth and
// WithMaxMessage.
//
// Read and Write copy between the caller's slice and registered memory,
// so the caller may reuse its slice as soon as they return. Waiting is on
// the futures of the async API, which the completion pollers resolve: no
// OS thread blocks per connection.
type Conn struct {
	c       *rdma.Conn
	laddr   net.Addr
	raddr   net.Addr
	maxMsg  int // bytes per data message: what the peer accepts
	sqLimit int // send WRs this stream keeps in flight at most
	batch   int // credits worth a message of their own

	rsem, wsem chan struct{} // serialize Reads and Writes; waiting is interruptible
	closed     chan struct{}
	closeOnce  sync.Once
	closeErr   error
	rdl, wdl   deadline
	sendBatch  *rdma.Batch // used under wsem

	mu      sync.Mutex
	st      streamState
	rf      *rdma.Future // the outstanding Recv
	rx      []rxMsg      // received data not yet read
	rxq     []rxMsg      // rx's storage when it empties
	rerr    error        // why no more messages will come (after those in rx)
	serr    error        // the first failed send
	sends   []sendRec
	inflt   int  // send WRs posted and not yet known complete
	wclosed bool // fin sent (CloseWrite or Close)
	ctl     *rdma.Buffer
	done    bool // buffers released by Close
}

type rxMsg struct {
	b   *rdma.Buffer
	off int
}

type sendRec struct {
	f   *rdma.Future
	wrs int
}

// newStream starts the stream protocol on c. It owns c from here on and
// closes it on failure.
func newStream(c *rdma.Conn) (*Conn, error) {
	if c.RecvWindow() == 0 || c.SendWindow() == 0 {
		// Connections set up through rdma_cm have no credits, so no
		// window to bound the stream's messages by.
		c.Close()
		return nil, fmt.Errorf("rdma: stream: %w: the connection has no receive window (rdma_cm set-ups have none)", rdma.ErrNotSupported)
	}
	send, recv := c.QueueDepth()
	grant, window := c.RecvWindow()-streamReserve, c.SendWindow()-streamReserve
	if err := checkDepths(send, recv); err != nil || grant < 1 || window < 1 {
		c.Close()
		return nil, fmt.Errorf("rdma: stream: %w: queue depths must exceed %d (send %d, receive %d, receive windows %d here and %d at the peer)",
			rdma.ErrInvalid, streamReserve, send, recv, c.RecvWindow(), c.SendWindow())
	}
	s := &Conn{
		c: c, laddr: c.LocalAddr(), raddr: c.RemoteAddr(),
		maxMsg:  c.MaxMessage(),
		sqLimit: send - streamReserve,
		batch:   creditBatch(grant),
		rsem:    make(chan struct{}, 1), wsem: make(chan struct{}, 1),
		closed: make(chan struct{}),
		rdl:    makeDeadline(), wdl: makeDeadline(),
		st: newStreamState(grant, window),
	}
	s.sendBatch = c.NewBatch()
	s.rxq = make([]rxMsg, 0, s.st.grant)
	s.rx = s.rxq
	var err error
	if s.ctl, err = c.Alloc(64); err == nil {
		var hello *rdma.Buffer
		if hello, err = c.Alloc(streamHelloSize); err == nil {
			copy(hello.Bytes(), streamHello())
			f := c.SendWithImm(hello, streamImm(frameHello, 0))
			hello.Release()
			s.sends = append(s.sends, sendRec{f, 1})
			s.inflt = 1
			if f.Resolved() {
				err = f.Err()
			}
		}
	}
	if err != nil {
		if s.ctl != nil {
			s.ctl.Release()
		}
		c.Close()
		return nil, fmt.Errorf("rdma: stream hello: %w", err)
	}
	s.rf = c.Recv()
	return s, nil
}

// RDMAConn is the underlying connection of the async API. Operations on
// it share the queue pair with the stream: use it for one-sided
// operations (Write without immediate, Read, atomics, Expose) only; a
// Send, WriteWithImm or Recv of your own breaks the stream.
func (s *Conn) RDMAConn() *rdma.Conn { return s.c }

// ConnectionState is the state of the TLS session of the stream's RDMA
// connection (rdma.Conn.ConnectionState); ok is false without TLS.
func (s *Conn) ConnectionState() (state tls.ConnectionState, ok bool) {
	return s.c.ConnectionState()
}

// LocalAddr is the local address of the connection's control channel.
func (s *Conn) LocalAddr() net.Addr { return s.laddr }

// RemoteAddr is the peer's address.
func (s *Conn) RemoteAddr() net.Addr { return s.raddr }

func (s *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: s.laddr, Addr: s.raddr, Err: err}
}

// acquire takes sem, giving up when the stream closes or the deadline
// passes.
func (s *Conn) acquire(sem chan struct{}, dl *deadline) error {
	select {
	case <-s.closed:
		return net.ErrClosed
	case <-dl.wait():
		return os.ErrDeadlineExceeded
	default:
	}
	select {
	case sem <- struct{}{}:
	case <-s.closed:
		return net.ErrClosed
	case <-dl.wait():
		return os.ErrDeadlineExceeded
	}
	select {
	case <-s.closed:
		<-sem
		return net.ErrClosed
	case <-dl.wait():
		<-sem
		return os.ErrDeadlineExceeded
	default:
	}
	return nil
}

// pumpLocked takes every message that has arrived: data goes to rx,
// credits to the send side. It never blocks. Caller holds mu.
func (s *Conn) pumpLocked() {
	for s.rerr == nil && s.rf != nil && s.rf.Resolved() {
		f := s.rf
		s.rf = nil
		if err := f.Err(); err != nil {
			s.rerr = err
			return
		}
		b := f.Buffer()
		var payload []byte
		if b != nil {
			payload = b.Bytes()
		}
		imm, has := f.Imm()
		kind, err := s.st.onMessage(imm, has, payload)
		if err != nil || kind != frameData {
			if b != nil {
				b.Release()
			}
		} else {
			s.rx = append(s.rx, rxMsg{b: b})
		}
		if err != nil {
			s.rerr = err
			// The peer is broken: end the connection, telling the
			// peer why at once.
			s.c.Abort(fmt.Errorf("rdma: stream: %w", err))
			return
		}
		s.rf = s.c.Recv()
	}
}

// reapLocked forgets the sends that have completed. Caller holds mu.
func (s *Conn) reapLocked() {
	i := 0
	for ; i < len(s.sends) && s.sends[i].f.Resolved(); i++ {
		if err := s.sends[i].f.Err(); err != nil && s.serr == nil {
			s.serr = err
		}
		s.inflt -= s.sends[i].wrs
	}
	if i > 0 {
		n := copy(s.sends, s.sends[i:])
		clear(s.sends[n:])
		s.sends = s.sends[:n]
	}
}

// Read reads data into p. It returns io.EOF once the peer has closed (or
// half-closed) and every byte it sent has been read.
func (s *Conn) Read(p []byte) (int, error) {
	if err := s.acquire(s.rsem, &s.rdl); err != nil {
		return 0, s.opError("read", err)
	}
	defer func() { <-s.rsem }()
	if len(p) == 0 {
		return 0, nil
	}
	for {
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			return 0, s.opError("read", net.ErrClosed)
		}
		s.pumpLocked()
		if len(s.rx) > 0 {
			n, freed := s.copyOutLocked(p)
			credits := 0
			if freed > 0 {
				s.st.consumed(freed)
				if s.st.pending >= s.batch {
					credits = s.st.take()
				}
			}
			s.mu.Unlock()
			if credits > 0 {
				s.sendControl(frameCredit, credits)
			}
			return n, nil
		}
		if s.st.fin {
			s.mu.Unlock()
			return 0, io.EOF
		}
		if s.rerr != nil {
			err := s.rerr
			s.mu.Unlock()
			return 0, s.opError("read", s.peerErr(err))
		}
		arrived := s.rf.Done()
		s.mu.Unlock()
		select {
		case <-arrived:
		case <-s.closed:
			return 0, s.opError("read", net.ErrClosed)
		case <-s.rdl.wait():
			return 0, s.opError("read", os.ErrDeadlineExceeded)
		}
	}
}

// copyOutLocked copies buffered data into p and releases the messages it
// empties; it returns the bytes copied and the messages emptied.
func (s *Conn) copyOutLocked(p []byte) (n, freed int) {
	for n < len(p) && len(s.rx) > 0 {
		m := &s.rx[0]
		data := m.b.Bytes()[m.off:]
		k := copy(p[n:], data)
		n += k
		m.off += k
		if k < len(data) {
			break
		}
		m.b.Release()
		s.rx[0] = rxMsg{}
		s.rx = s.rx[1:]
		freed++
	}
	if len(s.rx) == 0 {
		s.rx = s.rxq[:0]
	}
	return n, freed
}

// peerErr turns the receive side's failure into what Read and Write
// report: a local close is net.ErrClosed, anything else a reset.
func (s *Conn) peerErr(err error) error {
	select {
	case <-s.closed:
		return net.ErrClosed
	default:
	}
	return streamReset(err)
}

// sendControl sends an empty credit or fin message carrying credits.
// Errors show up on the next Read or Write, through the connection.
func (s *Conn) sendControl(kind uint8, credits int) {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	ctl, err := s.ctl.Slice(0, 0)
	s.mu.Unlock()
	if err != nil {
		return
	}
	f := s.c.SendWithImm(ctl, streamImm(kind, credits))
	s.mu.Lock()
	s.reapLocked() // a reader that never writes must not pile sends up
	s.sends = append(s.sends, sendRec{f, 1})
	s.inflt++
	s.mu.Unlock()
}

// Write writes p. It returns when every byte has been copied into
// registered memory and posted; it blocks while the peer has not
// consumed enough of what was sent before.
func (s *Conn) Write(p []byte) (int, error) {
	if err := s.acquire(s.wsem, &s.wdl); err != nil {
		return 0, s.opError("write", err)
	}
	defer func() { <-s.wsem }()
	n := 0
	for n < len(p) {
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			return n, s.opError("write", net.ErrClosed)
		}
		if s.wclosed {
			s.mu.Unlock()
			return n, s.opError("write", errWriteClosed)
		}
		s.pumpLocked()
		s.reapLocked()
		if err := s.writeErrLocked(); err != nil {
			s.mu.Unlock()
			return n, s.opError("write", err)
		}
		msgs := (len(p) - n + s.maxMsg - 1) / s.maxMsg
		k := min(s.st.credits(), s.sqLimit-s.inflt, msgs)
		if k <= 0 {
			arrived := s.rf.Done()
			var sent <-chan struct{}
			if s.inflt >= s.sqLimit && len(s.sends) > 0 {
				sent = s.sends[0].f.Done()
			}
			s.mu.Unlock()
			select {
			case <-arrived:
			case <-sent:
			case <-s.closed:
				return n, s.opError("write", net.ErrClosed)
			case <-s.wdl.wait():
				return n, s.opError("write", os.ErrDeadlineExceeded)
			}
			continue
		}
		credits := s.st.take()
		s.st.sent(k)
		s.inflt += k
		s.mu.Unlock()
		m, err := s.post(p[n:], k, credits)
		n += m
		if err != nil {
			if s.c.Err() != nil {
				err = s.peerErr(err) // the connection failed or closed
			}
			return n, s.opError("write", err)
		}
	}
	return n, nil
}

// writeErrLocked is why Write cannot go on, or nil.
func (s *Conn) writeErrLocked() error {
	err := s.serr
	if err == nil {
		err = s.rerr
	}
	if err == nil {
		return nil
	}
	return s.peerErr(err)
}

// post copies up to k messages of p into registered memory and posts
// them as one chain, the first carrying credits. Credits and send slots
// for k messages are taken; those not used are given back.
func (s *Conn) post(p []byte, k, credits int) (int, error) {
	n, posted := 0, 0
	var err error
	for posted < k && n < len(p) {
		m := min(len(p)-n, s.maxMsg)
		var pb *rdma.Buffer
		if pb, err = s.c.Alloc(m); err != nil {
			break
		}
		copy(pb.Bytes(), p[n:n+m])
		imm := streamImm(frameData, 0)
		if posted == 0 {
			imm = streamImm(frameData, credits)
		}
		s.sendBatch.SendWithImm(pb, imm)
		pb.Release() // the send holds the memory until it completes
		n += m
		posted++
	}
	var f *rdma.Future
	if posted > 0 {
		f = s.sendBatch.Post()
	}
	s.mu.Lock()
	if posted < k {
		s.st.unsent(k - posted)
		s.inflt -= k - posted
		if posted == 0 {
			s.st.pending += credits // not sent after all
			s.st.unacked += credits
		}
	}
	if f != nil {
		s.sends = append(s.sends, sendRec{f, posted})
		if f.Resolved() && f.Err() != nil {
			err = f.Err()
		}
	}
	s.mu.Unlock()
	return n, err
}

// CloseWrite shuts down the writing side: the peer's Read returns io.EOF
// after the data sent so far. Reading goes on.
func (s *Conn) CloseWrite() error {
	if err := s.acquire(s.wsem, &deadline{}); err != nil {
		return s.opError("close", err)
	}
	defer func() { <-s.wsem }()
	return s.finLocked()
}

// finLocked sends the fin once. Caller holds wsem.
func (s *Conn) finLocked() error {
	s.mu.Lock()
	if s.wclosed || s.done {
		s.mu.Unlock()
		return nil
	}
	s.wclosed = true
	credits := s.st.take()
	s.mu.Unlock()
	s.sendControl(frameFin, credits)
	return nil
}

// Close closes the stream. Pending and later Reads and Writes fail with
// an error wrapping net.ErrClosed. Unless CloseWrite came first, the peer
// reads io.EOF after the data sent so far. Close is idempotent.
func (s *Conn) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		// The writer, if any, leaves at once; the fin must follow its
		// last message.
		s.wsem <- struct{}{}
		s.mu.Lock()
		ok := s.rerr == nil && s.serr == nil
		s.mu.Unlock()
		if ok {
			s.finLocked()
		}
		<-s.wsem
		// Close waits (bounded) for the sends in flight, the fin
		// included, to complete, so the peer gets them before it hears
		// of the close.
		err := s.c.Close()
		s.rdl.set(time.Time{})
		s.wdl.set(time.Time{})
		s.mu.Lock()
		s.done = true
		for _, m := range s.rx {
			m.b.Release()
		}
		s.rx = nil
		// Close resolved every receive; one that got a message holds
		// its buffer.
		if s.rf != nil && s.rf.Resolved() {
			if b := s.rf.Buffer(); b != nil {
				b.Release()
			}
		}
		s.rf = nil
		s.ctl.Release()
		s.sends = nil
		s.mu.Unlock()
		if err != nil {
			s.closeErr = s.opError("close", err)
		}
	})
	return s.closeErr
}

// SetDeadline sets the read and write deadlines.
func (s *Conn) SetDeadline(t time.Time) error {
	s.rdl.set(t)
	s.wdl.set(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads.
func (s *Conn) SetReadDeadline(t time.Time) error {
	s.rdl.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes.
func (s *Conn) SetWriteDeadline(t time.Time) error {
	s.wdl.set(t)
	return nil
}

// deadline is an absolute time that closes a channel when it passes, as
// net.Pipe's pipeDeadline does. The zero deadline never passes.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
}

func makeDeadline() deadline { return deadline{cancel: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cancel == nil {
		return // the never-passing deadline of CloseWrite
	}
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait until it has closed cancel
	}
	d.timer = nil
	closed := isClosedChan(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// wait is closed when the deadline has passed; nil (never ready) for the
// zero deadline value.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

func isClosedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
