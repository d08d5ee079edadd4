package stream

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma"
)

// Conn is a byte stream over an RDMA connection: a net.Conn with the
// whole of its contract (concurrent use, Close unblocking pending calls,
// deadlines, io.EOF only on the peer's orderly close, *net.OpError
// errors). Dial and Listener.Accept return it.
//
// Bytes move by RDMA WRITE into a receive ring the peer exposes
// (DefaultRingSize unless Dialer.RingSize or ListenConfig.RingSize say
// otherwise; docs/stream.md describes the protocol). A writer may have
// at most the peer's ring of bytes that the peer has not read, so a slow
// reader holds the writer back and no memory grows. Memory per
// connection: this side's ring and a staging ring of the peer's ring
// size up to 1 MiB, registered memory from the engine's pool, and
// nothing else however many bytes are in flight. The peer may write any
// byte of this side's ring at any time, which garbles only the bytes it
// sends (see WriteTo, and docs/stream.md on a hostile peer).
//
// Write copies into staging and posts at once when nothing is in
// flight; while a WRITE is in flight, later Writes gather behind it and
// go out when it completes, or as soon as they fill a WRITE of their own
// (SMC-R's autocork: no timer ever delays a Write). Read copies out of
// the ring. The caller may reuse its slice as soon as either returns.
// Waiting is on the futures of the async API, which the completion
// pollers resolve: no OS thread blocks per connection.
type Conn struct {
	c     *rdma.Conn
	nc    net.Conn // the bytes' connection when c fell back to TCP (fallback.go); nil over RDMA
	laddr net.Addr
	raddr net.Addr

	sqLimit int  // data messages this stream keeps in flight at most
	hdr     bool // header mode (ring.go): no credits of the library's, or no immediate data
	slots   int  // header mode: headers in ctl, one per message in flight

	rsem, wsem chan struct{} // serialize Reads and Writes; waiting is interruptible
	closed     chan struct{}
	closeOnce  sync.Once
	closeErr   error
	rdl, wdl   deadline
	flushers   sync.WaitGroup // the corked bytes' poster, while it runs

	// The contexts of the waits of Read, Write and the flusher: a
	// context of the stream's own allocates nothing per wait.
	rctx, wctx, fctx chanCtx

	mu       sync.Mutex
	st       ringState
	ring     *rdma.Buffer // our receive ring, exposed to the peer
	ringMem  []byte
	staging  *rdma.Buffer // what we write, at its offset in the peer's ring
	stageMem []byte
	ctl      *rdma.Buffer // empty messages' source; in header mode, the headers
	src      rdma.Slice   // the Local of the post in hand (no allocation per post)
	hsrc     rdma.Slice   // header mode: the header of the post in hand
	batch    *rdma.Batch  // header mode: a data message's WRITE and SEND
	rf       *rdma.Future // the outstanding Recv
	rerr     error        // why no more messages will come
	serr     error        // the first failed send
	sends    []sendRec    // posted, oldest first
	waiting  int          // goroutines in waitLocked: futures are not reused meanwhile
	flushing bool         // a flusher goroutine runs
	finOwed  bool         // header mode: the fin waits for the window or for corked bytes
	credOwed bool         // header mode: credits wait for the window
	filling  bool         // a piece of staging is being filled (reserve to commit)
	draining bool         // a piece of the ring is being read (nextReadable to consume)
	wclosed  bool         // fin sent (CloseWrite or Close)
	done     bool         // buffers released by Close
}

// sendRec is a message in flight: when it completes, the bytes of
// staging up to end (0 for a message that carries none) are free.
type sendRec struct {
	f   *rdma.Future
	end uint64
}

// forceHeaderMode makes every new stream use header mode: tests set it
// to run that mode on the soft provider.
var forceHeaderMode atomic.Bool

// newStream starts the stream protocol on c with a receive ring of
// ringSize bytes. It owns c from here on and closes it on failure.
// checkTransport refuses an unreliable transport: a stream's bytes
// must all arrive, in order.
func checkTransport(t rdma.Transport) error {
	if t != rdma.RC {
		return fmt.Errorf("rdma: stream: %w: a stream needs a reliable connection (RC), not %v (rdma.WithTransport)", rdma.ErrNotSupported, t)
	}
	return nil
}

func newStream(c *rdma.Conn, ringSize int) (*Conn, error) {
	// Depths too small for a stream over RDMA fail over TCP too: the
	// same options must work where there is a device.
	send, recv := c.QueueDepth()
	err := checkDepths(send, recv)
	if err == nil && c.Transport() == rdma.TCP {
		return newTCPStream(c), nil
	}
	if err == nil {
		err = checkTransport(c.Transport())
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	s := &Conn{
		c: c, laddr: c.LocalAddr(), raddr: c.RemoteAddr(),
		sqLimit: send - streamReserve,
		rsem:    make(chan struct{}, 1), wsem: make(chan struct{}, 1),
		closed: make(chan struct{}),
		rdl:    makeDeadline(), wdl: makeDeadline(),
		st:    newRingState(ringSize),
		sends: make([]sendRec, 0, send),
	}
	if !c.Credited() || forceHeaderMode.Load() {
		// rdma_cm: every message counts against the peer's receive
		// window, and a data message is two WRs (ring.go).
		if w := c.SendWindow(); w < minWindow {
			c.Close()
			return nil, fmt.Errorf("rdma: stream: %w: the peer's receive window is %d messages (a stream needs %d; a go-rdma peer before v0.2.0 says none)", rdma.ErrNotSupported, w, minWindow)
		}
		s.hdr, s.slots, s.sqLimit = true, send, (send-streamReserve)/2
		s.st = newHeaderState(ringSize, c.SendWindow(), c.RecvWindow())
		s.batch = c.NewBatch()
	}
	if err := s.start(ringSize); err != nil {
		for _, b := range []*rdma.Buffer{s.ring, s.ctl} {
			if b != nil {
				b.Release()
			}
		}
		c.Close()
		return nil, fmt.Errorf("rdma: stream hello: %w", err)
	}
	return s, nil
}

// start exposes the ring and says hello.
func (s *Conn) start(ringSize int) error {
	var err error
	if s.ring, err = s.c.Alloc(ringSize); err != nil {
		return err
	}
	s.ringMem = s.ring.Bytes()
	region, err := s.c.Expose(s.ring, rdma.RemoteWrite)
	if err != nil {
		return err
	}
	// ctl: the hello, then in header mode a header per message in
	// flight.
	if s.ctl, err = s.c.Alloc(hdrSize + helloSize + s.slots*hdrSize); err != nil {
		return err
	}
	var f *rdma.Future
	if s.hdr {
		hello, err := s.ctl.Slice(0, hdrSize+helloSize)
		if err != nil {
			return err
		}
		s.st.header(hello.Bytes(), opHello, 0)
		marshalHello(hello.Bytes()[hdrSize:], region)
		f = s.c.Send(hello)
	} else {
		hello, err := s.ctl.Slice(0, helloSize)
		if err != nil {
			return err
		}
		marshalHello(hello.Bytes(), region)
		f = s.c.SendWithImm(hello, streamImm(opHello, 0))
	}
	s.sends = append(s.sends, sendRec{f: f})
	if f.Resolved() && f.Err() != nil {
		return f.Err()
	}
	s.rf = s.c.Recv()
	return nil
}

// RDMAConn is the underlying connection of the async API. Operations on
// it share the queue pair with the stream: use it for one-sided
// operations (Write without immediate, Read, atomics, Expose) only; a
// Send, WriteWithImm or Recv of your own breaks the stream. It is nil
// when the stream fell back to TCP (Transport): there is no RDMA
// connection then.
func (s *Conn) RDMAConn() *rdma.Conn {
	if s.nc != nil {
		return nil
	}
	return s.c
}

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
// passes. Close passes the deadlines too, so a closed stream is checked
// first: it is the error that counts. A deadline that passed and was
// extended while we waited gives a new channel to wait on.
func (s *Conn) acquire(sem chan struct{}, dl *deadline) error {
	for {
		if err := s.endedErr(dl); err != nil {
			return err
		}
		select {
		case sem <- struct{}{}:
			if err := s.endedErr(dl); err != nil {
				<-sem
				return err
			}
			return nil
		case <-s.closed:
		case <-dl.wait():
		}
	}
}

// endedErr is why a call cannot go on now (the stream closed, the
// deadline passed), or nil.
func (s *Conn) endedErr(dl *deadline) error {
	if isClosedChan(s.closed) {
		return net.ErrClosed
	}
	if isClosedChan(dl.wait()) {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// pumpLocked takes every message that has arrived and applies it. It
// never blocks. Caller holds mu.
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
		imm, n, written, body, err := s.st.unwrap(imm, has, f.Len(), payload)
		switch {
		case err != nil && !s.st.hello:
			err = fmt.Errorf("%w: the first message is not a stream hello; the peer is not a go-rdma stream (%w)", ErrProtocol, err)
		case err != nil:
		case !s.st.hello:
			if err = s.st.onHello(imm, body); err == nil {
				s.staging, err = s.c.Alloc(int(s.st.ssize))
				if err == nil {
					s.stageMem = s.staging.Bytes()
				}
			}
		default:
			err = s.st.onMessage(imm, n, written)
		}
		if b != nil {
			b.Release()
		}
		s.releaseLocked(f)
		if err != nil {
			s.rerr = err
			// The peer is broken: end the connection, telling the
			// peer why at once.
			s.c.Abort(fmt.Errorf("rdma: stream: %w", err))
			return
		}
		s.rf = s.c.Recv()
	}
	if s.hdr && s.rerr == nil && s.st.tookDue() {
		// Our count of the peer's messages taken reopens its window.
		s.sendEmptyLocked(opCredit)
	}
}

// waitLocked waits, with mu unlocked, for f to resolve, for the stream
// to close or for dl to pass (nil: the stream's close only). It returns
// with mu locked: nil if f resolved, or why the wait ended.
func (s *Conn) waitLocked(f *rdma.Future, ctx *chanCtx, dl *deadline) error {
	ctx.ch = s.closed
	if dl != nil {
		ctx.ch = dl.wait() // Close passes the deadlines too
	}
	s.waiting++
	s.mu.Unlock()
	f.Wait(ctx)
	s.mu.Lock()
	s.waiting--
	if isClosedChan(s.closed) {
		return net.ErrClosed
	}
	if isClosedChan(ctx.ch) {
		return os.ErrDeadlineExceeded
	}
	return nil
}

// wait is waitLocked that returns with mu unlocked.
func (s *Conn) wait(f *rdma.Future, ctx *chanCtx, dl *deadline) error {
	err := s.waitLocked(f, ctx, dl)
	s.mu.Unlock()
	return err
}

// releaseLocked gives a resolved future back for reuse, unless someone
// may be waiting on it: then the collector takes it. Caller holds mu.
func (s *Conn) releaseLocked(f *rdma.Future) {
	if s.waiting == 0 {
		f.Release()
	}
}

// chanCtx is a context.Context that ends when ch closes, so that
// Future.Wait can wait on the stream's own channels.
type chanCtx struct{ ch chan struct{} }

func (c *chanCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *chanCtx) Done() <-chan struct{}       { return c.ch }
func (c *chanCtx) Value(any) any               { return nil }
func (c *chanCtx) Err() error {
	if isClosedChan(c.ch) {
		return context.Canceled
	}
	return nil
}

// reapLocked forgets the messages that have completed, and frees the
// staging they held. Caller holds mu.
func (s *Conn) reapLocked() {
	i := 0
	for ; i < len(s.sends) && s.sends[i].f.Resolved(); i++ {
		r := s.sends[i]
		if err := r.f.Err(); err != nil && s.serr == nil {
			s.serr = err
		}
		if r.end > s.st.completed {
			s.st.completed = r.end
		}
		s.releaseLocked(r.f)
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
	if s.nc != nil {
		return s.nc.Read(p)
	}
	if err := s.acquire(s.rsem, &s.rdl); err != nil {
		return 0, s.opError("read", err)
	}
	defer func() { <-s.rsem }()
	if len(p) == 0 {
		return 0, nil
	}
	piece, err := s.nextReadable()
	if err != nil {
		return 0, err
	}
	k := copy(p, piece)
	s.consume(k)
	return k, nil
}

// WriteTo writes what arrives to w, straight from the ring (one copy
// fewer than Read into a buffer and a Write of it), until the peer's fin,
// then returns nil. It is io.WriterTo, which io.Copy uses. An error of w
// is returned as it is; the stream's own are *net.OpError values.
//
// w.Write is handed the ring's memory itself, which the peer can write
// at any time (it holds write rights to the whole ring): a hostile peer
// can change bytes while w reads them. A w that checks bytes and then
// acts on them must copy them first, or use Read, which copies. As
// io.Writer requires, w must not keep the slice after Write returns.
func (s *Conn) WriteTo(w io.Writer) (int64, error) {
	if s.nc != nil {
		return s.writeToTCP(w)
	}
	if err := s.acquire(s.rsem, &s.rdl); err != nil {
		return 0, s.opError("read", err)
	}
	defer func() { <-s.rsem }()
	var n int64
	for {
		piece, err := s.nextReadable()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		k := len(piece)
		m, werr := w.Write(piece)
		m = max(0, min(m, k))
		n += int64(m)
		s.consume(m)
		if werr == nil && m < k {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			return n, werr
		}
	}
}

// nextReadable waits until bytes can be read and returns them: a
// contiguous piece of the ring. The protocol has the peer write none of
// them until we credit them (a hostile peer can write them at any time,
// which garbles only its own stream), and the ring stays until consume
// says they were read (Close leaves its release to consume meanwhile),
// so the caller holding rsem reads them without mu, for as long as it
// takes. The error is io.EOF after the peer's fin, or a *net.OpError.
func (s *Conn) nextReadable() ([]byte, error) {
	for {
		s.mu.Lock()
		if s.done {
			s.mu.Unlock()
			return nil, s.opError("read", net.ErrClosed)
		}
		s.pumpLocked()
		if off, k := s.st.readable(); k > 0 {
			s.draining = true
			piece := s.ringMem[off : off+k]
			s.mu.Unlock()
			return piece, nil
		}
		if s.st.fin {
			s.mu.Unlock()
			return nil, io.EOF
		}
		if s.rerr != nil {
			err := s.rerr
			s.mu.Unlock()
			return nil, s.opError("read", s.peerErr(err))
		}
		if err := s.wait(s.rf, &s.rctx, &s.rdl); err != nil {
			return nil, s.opError("read", err)
		}
	}
}

// consume frees the first k bytes of the piece nextReadable returned,
// read, and returns credits when they are due.
func (s *Conn) consume(k int) {
	s.mu.Lock()
	s.draining = false
	if s.done {
		s.releaseRingsLocked()
		s.mu.Unlock()
		return
	}
	s.st.read += uint64(k)
	if s.st.creditDue() {
		s.creditLocked()
	}
	s.mu.Unlock()
}

// creditLocked returns our credits: with the corked bytes if there are
// any, or on their own. Errors show up on the next Read or Write,
// through the connection. Caller holds mu.
func (s *Conn) creditLocked() {
	if s.st.sent < s.st.queued {
		s.flushLocked()
	}
	if s.st.creditDue() {
		s.sendEmptyLocked(opCredit)
	}
}

// sendEmptyLocked sends a credit or fin message. In header mode one
// that the peer's window has no room for is owed, and goes out as soon
// as it has (postOwedLocked). Caller holds mu.
func (s *Conn) sendEmptyLocked(op uint8) {
	s.reapLocked() // a reader that never writes must not pile messages up
	if !s.hdr {
		var err error
		if s.src, err = s.ctl.Slice(0, 0); err != nil {
			return
		}
		f := s.c.SendWithImm(&s.src, s.st.imm(op))
		s.sends = append(s.sends, sendRec{f: f})
		return
	}
	if op == opFin && s.st.sent < s.st.queued || !s.st.canSend(op) || len(s.sends) >= s.slots {
		if op == opFin {
			s.finOwed = true
		} else {
			s.credOwed = true
		}
		s.kickLocked()
		return
	}
	if !s.nextHeaderLocked(op, 0) {
		return
	}
	if op == opFin {
		s.finOwed = false
	}
	s.credOwed = false // every message carries the credits
	f := s.c.Send(&s.hsrc)
	s.sends = append(s.sends, sendRec{f: f})
}

// nextHeaderLocked fills the header of the next message, of op and n
// bytes, in its slot of ctl and makes hsrc that slot. Its last user
// has completed: a slot is used again only after slots more messages,
// and sendEmptyLocked and flushLocked keep fewer in flight. Caller holds
// mu.
func (s *Conn) nextHeaderLocked(op uint8, n int) bool {
	off := hdrSize + helloSize + int(s.st.msgs%uint32(s.slots))*hdrSize
	var err error
	if s.hsrc, err = s.ctl.Slice(off, hdrSize); err != nil {
		s.serr = err
		return false
	}
	s.st.header(s.hsrc.Bytes(), op, n)
	return true
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

// Write writes p. It returns when every byte has been copied into
// registered memory, to be posted at once or behind the WRITE in
// flight; it blocks while the peer's ring is full of bytes the peer has
// not read.
func (s *Conn) Write(p []byte) (int, error) {
	if s.nc != nil {
		return s.nc.Write(p)
	}
	if err := s.acquire(s.wsem, &s.wdl); err != nil {
		return 0, s.opError("write", err)
	}
	defer func() { <-s.wsem }()
	n := 0
	for n < len(p) {
		piece, err := s.reserve(len(p) - n)
		if err != nil {
			return n, err
		}
		k := copy(piece, p[n:])
		if err := s.commit(k); err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// ReadFrom writes what it reads from r until io.EOF, reading straight
// into registered memory (one copy fewer than a Read into a buffer and
// a Write of it), and returns nil at r's EOF. It is io.ReaderFrom, which
// io.Copy uses. An error of r is returned as it is; the stream's own are
// *net.OpError values.
func (s *Conn) ReadFrom(r io.Reader) (int64, error) {
	if s.nc != nil {
		return s.readFromTCP(r)
	}
	if err := s.acquire(s.wsem, &s.wdl); err != nil {
		return 0, s.opError("write", err)
	}
	defer func() { <-s.wsem }()
	var n int64
	for {
		piece, err := s.reserve(maxCork)
		if err != nil {
			return n, err
		}
		m, rerr := r.Read(piece)
		m = max(0, min(m, len(piece)))
		if err := s.commit(m); err != nil {
			return n, err
		}
		n += int64(m)
		if rerr == io.EOF {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// reserve waits until staging has room and returns where the next at
// most n bytes go: a contiguous piece of it. Nobody else touches staging
// past what was committed (the flusher posts only that), and staging
// stays until commit (Close leaves its release to commit meanwhile), so
// the caller holding wsem fills it without mu, for as long as it takes.
// Errors are *net.OpError values.
func (s *Conn) reserve(n int) ([]byte, error) {
	for {
		s.mu.Lock()
		if err := s.writeEndedLocked(); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		s.pumpLocked()
		s.reapLocked()
		if s.st.sent < s.st.queued && s.nothingAheadLocked() {
			// Corked bytes whose WRITE ahead completed: post them
			// here rather than wait for the flusher, since in header
			// mode what may be staged counts from them.
			s.flushLocked()
		}
		if err := s.writeErrLocked(); err != nil {
			s.mu.Unlock()
			return nil, s.opError("write", err)
		}
		off, k := s.st.writable(n)
		if k > 0 && len(s.sends) < s.sqLimit {
			s.filling = true
			piece := s.stageMem[off : off+k]
			s.mu.Unlock()
			return piece, nil
		}
		if err := s.wait(s.writeBlockerLocked(), &s.wctx, &s.wdl); err != nil {
			return nil, s.opError("write", err)
		}
	}
}

// commit queues k bytes filled after reserve: they go out at once when
// nothing is in flight or a WRITE's worth has gathered, else behind the
// WRITE in flight (autocork).
func (s *Conn) commit(k int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.filling = false
	if err := s.writeEndedLocked(); err != nil {
		// Close or CloseWrite came while the piece was filled: its
		// bytes are not sent (the fin is out).
		if s.done {
			s.releaseRingsLocked()
		}
		return err
	}
	if k == 0 {
		return nil
	}
	s.st.queued += uint64(k)
	if s.nothingAheadLocked() || int(s.st.queued-s.st.sent) >= s.st.cork() {
		s.flushLocked()
	}
	s.kickLocked()
	if s.serr != nil {
		return s.opError("write", s.peerErr(s.serr))
	}
	return nil
}

// nothingAheadLocked says whether corked bytes need not wait: nothing is
// in flight, or nothing the peer has not read already (the completion
// is on its way: a ping-pong's reply often comes before it). Caller
// holds mu.
func (s *Conn) nothingAheadLocked() bool {
	return len(s.sends) == 0 || s.st.acked == s.st.sent
}

// flushLocked posts every byte queued in staging, as one WRITE, or two
// where it wraps around the ring; in header mode, as far as the peer's
// window has room. Caller holds mu.
func (s *Conn) flushLocked() {
	for s.st.sent < s.st.queued && s.serr == nil {
		if s.hdr && (!s.st.canSend(opData) || len(s.sends) >= s.sqLimit) {
			s.reapLocked()
			if !s.st.canSend(opData) || len(s.sends) >= s.sqLimit {
				return // postOwedLocked goes on
			}
		}
		soff, roff, k := s.st.nextWrite()
		var dst rdma.RemoteRegion
		var err error
		if s.src, err = s.staging.Slice(soff, k); err == nil {
			dst, err = s.st.peer.Slice(roff, k)
		}
		if err != nil {
			s.serr = err
			return
		}
		var f *rdma.Future
		if s.hdr {
			if !s.nextHeaderLocked(opData, k) {
				return
			}
			s.credOwed = false
			s.batch.Write(&s.src, dst)
			s.batch.Send(&s.hsrc)
			f = s.batch.Post()
		} else {
			f = s.c.WriteWithImm(&s.src, dst, s.st.imm(opData))
		}
		s.st.sent += uint64(k)
		s.sends = append(s.sends, sendRec{f: f, end: s.st.sent})
		if f.Resolved() && f.Err() != nil {
			s.serr = f.Err()
		}
	}
}

// owesLocked says whether something waits to be posted: corked bytes,
// or in header mode a fin or credits the peer's window had no room for.
// Caller holds mu.
func (s *Conn) owesLocked() bool {
	return s.st.sent < s.st.queued || s.finOwed || s.credOwed
}

// kickLocked starts the flusher if something waits to be posted and no
// flusher runs. Caller holds mu.
func (s *Conn) kickLocked() {
	if s.owesLocked() && !s.flushing && !s.done {
		s.flushing = true
		s.flushers.Add(1)
		go s.flusher()
	}
}

// postOwedLocked posts what waits, as far as it may go now: corked
// bytes once nothing is ahead of them (autocork), then a fin or credits
// owed. Caller holds mu.
func (s *Conn) postOwedLocked() {
	if s.st.sent < s.st.queued && s.nothingAheadLocked() {
		s.flushLocked()
	}
	if s.finOwed && s.st.sent == s.st.queued {
		s.sendEmptyLocked(opFin)
	}
	if s.credOwed {
		s.sendEmptyLocked(opCredit)
	}
}

// blockerLocked is what the flusher waits for: the peer's next message
// when the peer's window holds back what waits (header mode), else the
// oldest message in flight. Caller holds mu.
func (s *Conn) blockerLocked() *rdma.Future {
	op := uint8(opCredit)
	if s.st.sent < s.st.queued || s.finOwed {
		op = opData
	}
	if len(s.sends) == 0 || s.hdr && !s.st.canSend(op) {
		return s.rf
	}
	return s.sends[0].f
}

// writeBlockerLocked is what a Write that found no room waits for: the
// oldest message in flight when its completion makes room (staging, the
// send queue, or the bytes corked behind it, from which header mode
// counts what may be staged: the flusher posts them, and would not wake
// a Write waiting for the peer), else the peer's next message (its
// credits, its hello, or in header mode its count of our messages
// taken). Caller holds mu.
func (s *Conn) writeBlockerLocked() *rdma.Future {
	if len(s.sends) > 0 && (len(s.sends) >= s.sqLimit || s.st.free() == 0 && s.st.stagingFull() ||
		s.st.sent < s.st.queued && s.st.canSend(opData)) {
		return s.sends[0].f
	}
	return s.rf
}

// flusher posts what waits (owesLocked): corked bytes once the messages
// in flight ahead of them have completed, and in header mode what the
// peer's window held back once the peer says it took our messages. It
// runs only while something waits, so an idle stream has no goroutine.
func (s *Conn) flusher() {
	defer s.flushers.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fctx.ch = s.closed // Close posts what is left before its fin
	s.sendOwedLocked(&s.fctx)
	s.flushing = false
}

// sendOwedLocked posts what waits, as far as it may go, and waits for
// what holds the rest back (blockerLocked), until nothing waits, the
// stream's sends fail, nothing more comes from the peer, or ctx ends.
// Caller holds mu.
func (s *Conn) sendOwedLocked(ctx *chanCtx) {
	for !isClosedChan(ctx.ch) {
		s.reapLocked()
		if s.hdr {
			s.pumpLocked() // the peer's count of our messages taken
		}
		if s.done || s.serr != nil {
			return
		}
		s.postOwedLocked()
		if !s.owesLocked() {
			return
		}
		f := s.blockerLocked()
		if f == nil {
			return
		}
		s.waiting++
		s.mu.Unlock()
		f.Wait(ctx)
		s.mu.Lock()
		s.waiting--
	}
}

// writeEndedLocked is the error of a write after Close or CloseWrite.
func (s *Conn) writeEndedLocked() error {
	if s.done || isClosedChan(s.closed) {
		return s.opError("write", net.ErrClosed)
	}
	if s.wclosed {
		return s.opError("write", errWriteClosed)
	}
	return nil
}

// releaseRingsLocked gives the ring and staging back to the pool once
// Close is done and nobody reads or fills them. Caller holds mu.
func (s *Conn) releaseRingsLocked() {
	if s.ring != nil && !s.draining {
		s.ring.Release()
		s.ring, s.ringMem = nil, nil
	}
	if s.staging != nil && !s.filling {
		s.staging.Release()
		s.staging, s.stageMem = nil, nil
	}
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

// CloseWrite shuts down the writing side: the peer's Read returns io.EOF
// after the data sent so far. Reading goes on.
func (s *Conn) CloseWrite() error {
	if s.nc != nil {
		return s.closeWriteTCP()
	}
	if err := s.acquire(s.wsem, &deadline{}); err != nil {
		return s.opError("close", err)
	}
	defer func() { <-s.wsem }()
	s.fin()
	return nil
}

// fin sends what is corked, then the fin, once. A piece being filled
// (reserve) is not sent: its commit fails.
func (s *Conn) fin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wclosed || s.done {
		return
	}
	s.wclosed = true
	s.flushLocked()
	s.sendEmptyLocked(opFin)
}

// closeBound bounds how long Close waits, in header mode, for the
// peer's window to take what waits to be posted (its fin included).
const closeBound = 5 * time.Second

// drainOwed posts what waits as the peer's window opens, for at most
// closeBound: Close's work in header mode, where the flusher has
// stopped.
func (s *Conn) drainOwed() {
	ctx := chanCtx{ch: make(chan struct{})}
	t := time.AfterFunc(closeBound, func() { close(ctx.ch) })
	defer t.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sendOwedLocked(&ctx)
}

// Close closes the stream. Pending and later Reads and Writes fail with
// an error wrapping net.ErrClosed. Unless CloseWrite came first, the peer
// reads io.EOF after the data sent so far. Close is idempotent.
func (s *Conn) Close() error {
	if s.nc != nil {
		return s.closeTCP()
	}
	s.closeOnce.Do(func() {
		close(s.closed)
		// Waits end on the deadlines' channels: passing them wakes
		// every blocked call, and stops their timers.
		past := time.Unix(1, 0)
		s.rdl.set(past)
		s.wdl.set(past)
		// The fin follows the bytes committed so far; a Write or
		// ReadFrom filling a piece now sees the close at its commit.
		s.mu.Lock()
		ok := s.rerr == nil && s.serr == nil
		s.mu.Unlock()
		if ok {
			s.fin()
			if s.hdr {
				s.flushers.Wait() // it stops at the close
				s.drainOwed()
			}
		}
		// Close waits (bounded) for the messages in flight, the fin
		// included, to complete, so the peer gets them before it
		// hears of the close; the exposure of the ring ends with it.
		err := s.c.Close()
		s.flushers.Wait()
		s.mu.Lock()
		s.done = true
		// Close resolved every receive; one that got a message holds
		// its buffer.
		if s.rf != nil && s.rf.Resolved() {
			if b := s.rf.Buffer(); b != nil {
				b.Release()
			}
		}
		s.rf = nil
		s.ctl.Release()
		// A Read or Write copying now releases what it uses when it
		// is done (consume, commit).
		s.releaseRingsLocked()
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
	if s.nc != nil {
		return s.setDeadlineTCP(t, true, true)
	}
	s.rdl.set(t)
	s.wdl.set(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads.
func (s *Conn) SetReadDeadline(t time.Time) error {
	if s.nc != nil {
		return s.setDeadlineTCP(t, true, false)
	}
	s.rdl.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes.
func (s *Conn) SetWriteDeadline(t time.Time) error {
	if s.nc != nil {
		return s.setDeadlineTCP(t, false, true)
	}
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
