package soft

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

const (
	// ioTimeout bounds how long a connection may stall in the middle of
	// a frame, in either direction, before it is declared dead.
	ioTimeout        = 5 * time.Second
	dialTimeout      = 3 * time.Second
	handshakeTimeout = 3 * time.Second
	// ioChunk is the most read or written under one deadline, and the
	// most one writev carries.
	ioChunk = 1 << 20
	// wbufSize holds the headers (and small payloads) of the responses
	// written at once.
	wbufSize = 16 << 10
	// rbufSize is the read-ahead buffer: headers and the first bytes of
	// a payload come through it, the rest of the payload goes straight
	// into registered memory.
	rbufSize = 8 << 10
	// smallCopy: payload pieces shorter than this are copied next to
	// their header rather than written from their own buffer.
	smallCopy = 512
	// maxQueuedResp bounds the responses waiting to be written on one
	// connection; a peer that floods us past it is cut off.
	maxQueuedResp = 1 << 16
	// ackFrames and ackBytes: the reader writes its queued responses
	// when it has caught up with the peer, or after this many requests
	// or payload bytes, whichever comes first.
	ackFrames = 16
	ackBytes  = 512 << 10
)

// conn is a TCP connection to another soft provider. A provider sends its
// requests on connections it dialed and answers requests on the
// connection they came from. Each connection has a reader goroutine
// (requests and responses), which also writes the responses it queued
// (ACKs, NAKs, atomic responses) whenever it has caught up with the
// stream, and a writer goroutine for READ responses; QP workers write
// their requests themselves, several WRs in one writev.
type conn struct {
	nc      net.Conn
	peer    netip.AddrPort // the peer's listener address, as QPs name it
	peerGID verbs.GID
	stripe  int // of a dialed connection (see outKey)

	// Reader side.
	rx      rx
	h       header
	rdl     time.Time
	rscr    respScratch
	events  []*cq // CQ events of the frame being served (see cq.push)
	rsrc    streamSource
	rdead   atomic.Bool
	stall   atomic.Pointer[stallHook] // tests: hold the reader before its next frame
	rflush  []respEntry               // the reader's scratch for writing responses
	unacked int                       // requests served since the reader last wrote responses
	unbytes uint64                    // and their payload bytes

	// Writing: requests (QP workers) and responses (reader, writer
	// goroutine), a writev at a time.
	wmu   sync.Mutex
	wbuf  []byte   // response headers and small payloads
	wsegs [][]byte // responses being written
	wvec  net.Buffers
	wback [][]byte
	wdl   time.Time

	mu    sync.Mutex
	dead  bool
	resp  []respEntry
	nresp atomic.Int32 // len(resp)
	wake  chan struct{}
	done  chan struct{}
}

type respEntry struct {
	h    header
	mr   *mr
	data []byte
}

func newConn(nc net.Conn, peer netip.AddrPort) *conn {
	c := &conn{
		nc: nc, peer: peer, peerGID: verbs.GIDFromIP(peer.Addr()),
		wbuf: make([]byte, 0, wbufSize), wsegs: make([][]byte, 0, 64), wback: make([][]byte, 0, 256),
		rscr: newRespScratch(),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	c.rx = rx{nc: nc, sr: newScatterReader(nc), buf: make([]byte, rbufSize), idle: c.flushIdle, pending: c.hasResp}
	c.rsrc = streamSource{c: c}
	c.rscr.events = &c.events
	return c
}

func (c *conn) isDead() bool { return c.rdead.Load() }

// fail closes the connection. Every RC and UC QP connected to the peer
// goes to ERR (see peerLost): its peer is gone, stalled or broken.
func (c *conn) fail(err error, protocol bool) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	c.rdead.Store(true)
	pending := c.resp
	c.resp = nil
	c.nresp.Store(0)
	c.mu.Unlock()
	close(c.done)
	c.nc.Close()
	dev.forget(c)
	for _, e := range pending {
		if e.mr != nil {
			e.mr.refs.release()
		}
	}
	vendor := uint32(VendorErrConnLost)
	if protocol {
		vendor = VendorErrProtocol
	}
	reason := fmt.Errorf("soft: connection with %s: %w", c.peer, err)
	for _, n := range connectedTo(c.peer) {
		if q := getQP(n); q != nil {
			q.peerLost(c, vendor, reason)
			q.refs.release()
		}
	}
}

// stallHook holds a connection's reader, for tests: reached closes when
// the reader waits, and it waits until release closes.
type stallHook struct {
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (s *stallHook) reach() { s.once.Do(func() { close(s.reached) }) }

// lastHeard is when a read last brought bytes from the peer.
func (c *conn) lastHeard() time.Time { return time.Unix(0, c.rx.heard.Load()) }

// armRead keeps a read deadline ioTimeout ahead, refreshed lazily.
func (c *conn) armRead() {
	if now := time.Now(); c.rdl.Sub(now) < ioTimeout/2 {
		c.rdl = now.Add(ioTimeout)
		c.nc.SetReadDeadline(c.rdl)
	}
}

func (c *conn) armWrite() {
	if now := time.Now(); c.wdl.Sub(now) < ioTimeout/2 {
		c.wdl = now.Add(ioTimeout)
		c.nc.SetWriteDeadline(c.wdl)
	}
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

func (c *conn) readLoop() {
	defer dev.wg.Done()
	for {
		if err := c.readFrame(); err != nil {
			var ve *VersionError
			if errors.As(err, &ve) {
				ve.Peer = c.peer.String()
			}
			c.fail(err, errors.Is(err, errProtocol) || ve != nil)
			return
		}
	}
}

// readFrame reads and serves one frame. An error ends the connection.
func (c *conn) readFrame() error {
	if s := c.stall.Load(); s != nil {
		s.reach()
		<-s.release
	}
	// An idle connection may wait for ever; once a frame has begun, each
	// chunk of it must arrive within ioTimeout. The deadline is looked
	// at only before a read (a frame already buffered needs none): each
	// look reads the clock, which a ping-pong's profile found at 7 % of
	// its samples.
	x := &c.rx
	if x.buffered() == 0 {
		c.armRead()
		if _, err := x.read(nil); err != nil {
			if isTimeout(err) {
				return nil
			}
			return err
		}
	}
	if x.buffered() < hdrSize {
		c.armRead()
	}
	h := &c.h
	*h = header{}
	err := c.readHeader(h)
	if err == nil {
		switch h.typ {
		case frameRequest:
			err = c.onRequest(h)
			c.unacked++
			c.unbytes += uint64(h.length)
			if err == nil && (c.unacked >= ackFrames || c.unbytes >= ackBytes) {
				c.flushIdle()
			}
		case frameHello:
			err = fmt.Errorf("%w: hello in the middle of a connection", errProtocol)
		default:
			err = c.onResponse(h)
		}
	}
	c.raiseEvents()
	handleOverflows()
	return err
}

// raiseEvents raises the CQ events of the frame just served, holding no
// lock: a channel's direct handler takes a completion to its waiter from
// here, without waking the poller's goroutine first.
func (c *conn) raiseEvents() {
	if len(c.events) == 0 {
		return
	}
	for i, q := range c.events {
		raise(q)
		c.events[i] = nil
	}
	c.events = c.events[:0]
	// A waiter the handler woke sits in this P's runnext slot, where
	// another P takes it only after a sleep of up to 100 µs (see
	// internal/poller's doc), while this goroutine may go on to write
	// ACKs: let it run now.
	runtime.Gosched()
}

// readHeader reads one header from the stream. The prefix is checked
// first so that a peer of another version, whose header may have another
// size, is recognised rather than waited for.
func (c *conn) readHeader(h *header) error {
	x := &c.rx
	if err := x.need(prefixSize); err != nil {
		return streamErr("header", eofMid(err))
	}
	if err := checkPrefix(x.buf[x.r:x.w]); err != nil {
		return err
	}
	if err := x.need(hdrSize); err != nil {
		return fmt.Errorf("%w: truncated header: %w", errProtocol, eofMid(err))
	}
	return decodeHeader(x.next(hdrSize), h)
}

func (c *conn) onRequest(h *header) error {
	src := &c.rsrc
	src.left = uint64(h.length)
	r := getQP(h.dst)
	if r == nil {
		if err := src.discard(); err != nil {
			return err
		}
		if h.qpType != verbs.UD {
			return c.queue(header{typ: frameNak, op: nakUnknownQP, dst: h.src, src: h.dst, psn: h.psn}, nil, nil)
		}
		return nil
	}
	defer r.refs.release()
	req := request{
		op: verbs.Opcode(h.op), qpType: h.qpType, src: h.src, from: c.peer, fromGID: c.peerGID,
		psn: h.psn, length: uint64(h.length), imm: h.imm,
		hasImm: h.flags&flagImm != 0, solicited: h.flags&flagSolicited != 0,
		rkey: h.key, addr: h.addr, compare: h.compare, swap: h.swap,
	}
	if req.op == verbs.OpRead {
		req.length = h.compare
	}
	res := r.respond(&req, src, &c.rscr)
	if res.err != nil {
		if res.mr != nil {
			res.mr.refs.release()
		}
		return res.err
	}
	if err := src.discard(); err != nil {
		if res.mr != nil {
			res.mr.refs.release()
		}
		return err
	}
	resp := header{dst: h.src, src: h.dst, psn: h.psn}
	switch res.kind {
	case respAck:
		resp.typ = frameAck
	case respNak:
		resp.typ, resp.op, resp.aux = frameNak, res.nak, uint32(res.rnr)
	case respRead:
		resp.typ, resp.length = frameReadResp, uint32(len(res.data))
	case respAtomic:
		resp.typ, resp.compare = frameAtomicResp, res.value
	default:
		return nil
	}
	if h.qpType != verbs.RC {
		return nil
	}
	return c.queue(resp, res.mr, res.data)
}

func (c *conn) onResponse(h *header) error {
	src := &c.rsrc
	src.left = uint64(h.length)
	q := getQP(h.dst)
	if q == nil {
		return src.discard() // the QP is gone; its WRs went with it
	}
	defer q.refs.release()
	q.events.Store(&c.events)
	err := q.onResponse(c, h, &c.rscr.sgl, src)
	q.events.Store(nil)
	// Whoever loaded events before the Store holds mu while it appends:
	// once mu is free, c.events is the reader's alone again.
	q.mu.Lock()
	//lint:ignore SA2001 the critical section is empty: it waits for the appends
	q.mu.Unlock()
	if err != nil {
		return err
	}
	return src.discard()
}

// queue adds a response to the connection's queue. It is called by the
// reader, which writes the queue when it has caught up with the peer
// (flushIdle); a READ response, which carries data and holds its MR
// until written, goes to the writer goroutine at once.
func (c *conn) queue(h header, m *mr, data []byte) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		if m != nil {
			m.refs.release()
		}
		return net.ErrClosed
	}
	if n := len(c.resp); h.typ == frameAck && n > 0 && c.resp[n-1].h.typ == frameAck && c.resp[n-1].h.dst == h.dst {
		c.resp[n-1].h.psn = h.psn // ACKs are cumulative
		c.mu.Unlock()
		return nil
	}
	if len(c.resp) >= maxQueuedResp {
		c.mu.Unlock()
		if m != nil {
			m.refs.release()
		}
		return fmt.Errorf("%w: peer has %d responses queued and does not read them", errProtocol, maxQueuedResp)
	}
	c.resp = append(c.resp, respEntry{h: h, mr: m, data: data})
	c.nresp.Store(int32(len(c.resp)))
	c.mu.Unlock()
	if len(data) > 0 {
		c.kick()
	}
	return nil
}

func (c *conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) hasResp() bool { return c.nresp.Load() != 0 }

// flushIdle writes the queued responses from the reader's goroutine,
// unless another goroutine is writing on the connection, in which case
// the writer goroutine is asked to.
func (c *conn) flushIdle() {
	c.unacked, c.unbytes = 0, 0
	if !c.hasResp() {
		return
	}
	if !c.wmu.TryLock() {
		c.kick()
		return
	}
	var err error
	c.rflush, err = c.writeQueued(c.rflush)
	c.wmu.Unlock()
	if err != nil {
		c.fail(err, false)
	}
}

func (c *conn) writeLoop() {
	defer dev.wg.Done()
	var batch []respEntry
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		c.wmu.Lock()
		var err error
		batch, err = c.writeQueued(batch)
		c.wmu.Unlock()
		if err != nil {
			c.fail(err, false)
			return
		}
	}
}

// writeQueued takes the queued responses, in exchange for the caller's
// scratch batch, and writes them. Caller holds wmu, so responses go out
// in the order they were queued.
func (c *conn) writeQueued(batch []respEntry) ([]respEntry, error) {
	c.mu.Lock()
	batch, c.resp = c.resp, batch[:0]
	c.nresp.Store(0)
	c.mu.Unlock()
	err := c.writeResponses(batch)
	for i := range batch {
		if batch[i].mr != nil {
			batch[i].mr.refs.release()
		}
		batch[i] = respEntry{}
	}
	return batch[:0], err
}

// writeResponses writes batch: the headers (and small READ payloads)
// from wbuf, large READ payloads straight from registered memory, in as
// few writevs as the buffers allow. Caller holds wmu.
func (c *conn) writeResponses(batch []respEntry) error {
	segs := c.wsegs[:0]
	b := c.wbuf[:0]
	cut := 0
	for i := range batch {
		e := &batch[i]
		if len(b)+hdrSize+smallCopy > cap(b) || len(segs)+3 > cap(segs) {
			if cut < len(b) {
				segs = append(segs, b[cut:])
			}
			if err := c.writevLocked(segs); err != nil {
				return err
			}
			segs, b, cut = segs[:0], b[:0], 0
		}
		n := len(b)
		b = b[:n+hdrSize]
		e.h.encode((*[hdrSize]byte)(b[n:]))
		switch {
		case len(e.data) < smallCopy:
			b = append(b, e.data...)
		default:
			segs = append(segs, b[cut:], e.data)
			cut = len(b)
		}
	}
	if cut < len(b) {
		segs = append(segs, b[cut:])
	}
	err := c.writevLocked(segs)
	clear(segs)
	return err
}

// writeFrames writes segs (the frames of a QP's batch). Caller must not
// hold wmu.
func (c *conn) writeFrames(segs [][]byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writevLocked(segs)
}

// writevLocked writes segs in order with writev, at most ioChunk bytes
// at a time, each under a fresh deadline. It may reslice the elements
// of segs. Caller holds wmu.
func (c *conn) writevLocked(segs [][]byte) error {
	for i := 0; i < len(segs); {
		v := c.wback[:0]
		n := 0
		for i < len(segs) && n < ioChunk {
			b := segs[i]
			if k := ioChunk - n; len(b) > k {
				v = append(v, b[:k])
				segs[i] = b[k:]
				n += k
				break
			}
			if len(b) > 0 {
				v = append(v, b)
				n += len(b)
			}
			i++
		}
		if len(v) == 0 {
			break
		}
		c.armWrite()
		c.wvec = v
		_, err := c.wvec.WriteTo(c.nc)
		clear(v)
		c.wback = v[:0]
		if err != nil {
			return err
		}
	}
	return nil
}

// dialCall is one connection attempt that concurrent senders share.
type dialCall struct {
	done chan struct{}
	c    *conn
	err  error
}

// connTo returns a live connection to peer on the given stripe, dialing
// if needed.
func (d *device) connTo(peer netip.AddrPort, stripe int) (*conn, error) {
	k := outKey{peer, stripe}
	for {
		d.mu.Lock()
		if !d.running {
			d.mu.Unlock()
			return nil, fmt.Errorf("soft: device closed: %w", net.ErrClosed)
		}
		if dc := d.out[k]; dc != nil {
			d.mu.Unlock()
			<-dc.done
			if dc.err != nil {
				return nil, dc.err
			}
			if !dc.c.isDead() {
				return dc.c, nil
			}
			d.mu.Lock()
			if d.out[k] == dc {
				delete(d.out, k)
			}
			d.mu.Unlock()
			continue
		}
		dc := &dialCall{done: make(chan struct{})}
		d.out[k] = dc
		d.mu.Unlock()
		dc.c, dc.err = d.dial(peer, stripe)
		if dc.err != nil {
			d.mu.Lock()
			if d.out[k] == dc {
				delete(d.out, k)
			}
			d.mu.Unlock()
		}
		close(dc.done)
		return dc.c, dc.err
	}
}

func (d *device) dial(peer netip.AddrPort, stripe int) (*conn, error) {
	nc, err := net.DialTimeout("tcp", peer.String(), dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("soft: connect to peer %s: %w", peer, err)
	}
	if err := d.handshake(nc, peer); err != nil {
		nc.Close()
		return nil, err
	}
	c := newConn(nc, peer)
	c.stripe = stripe
	if !d.adopt(c) {
		nc.Close()
		return nil, fmt.Errorf("soft: device closed: %w", net.ErrClosed)
	}
	return c, nil
}

// handshake is the dialer's side: send our hello, check the peer's.
func (d *device) handshake(nc net.Conn, peer netip.AddrPort) error {
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	var buf [hdrSize + helloLen]byte
	h := header{typ: frameHello, length: helloLen}
	h.encode((*[hdrSize]byte)(buf[:hdrSize]))
	encodeHello(buf[hdrSize:], d.self())
	if _, err := nc.Write(buf[:]); err != nil {
		return fmt.Errorf("soft: hello to peer %s: %w", peer, err)
	}
	var rh header
	if err := readHeader(nc, (*[hdrSize]byte)(buf[:hdrSize]), &rh); err != nil {
		var ve *VersionError
		if errors.As(err, &ve) {
			ve.Peer = peer.String()
			return ve
		}
		return fmt.Errorf("soft: hello from peer %s: %w", peer, err)
	}
	if rh.typ != frameHello {
		return fmt.Errorf("soft: hello from peer %s: %w: got frame type %d", peer, errProtocol, rh.typ)
	}
	if _, err := io.ReadFull(nc, buf[hdrSize:]); err != nil {
		return fmt.Errorf("soft: hello from peer %s: %w", peer, err)
	}
	if _, err := decodeHello(buf[hdrSize:]); err != nil {
		return fmt.Errorf("soft: hello from peer %s: %w", peer, err)
	}
	nc.SetDeadline(time.Time{})
	return nil
}

// acceptConn is the listener's side of the handshake.
func (d *device) acceptConn(nc net.Conn) {
	defer d.wg.Done()
	c, err := d.answer(nc)
	d.mu.Lock()
	delete(d.raw, nc)
	d.mu.Unlock()
	if err != nil {
		nc.Close()
		return
	}
	if !d.adopt(c) {
		nc.Close()
	}
}

func (d *device) answer(nc net.Conn) (*conn, error) {
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	var buf [hdrSize + helloLen]byte
	var h header
	err := readHeader(nc, (*[hdrSize]byte)(buf[:hdrSize]), &h)
	reply := func() error {
		rh := header{typ: frameHello, length: helloLen}
		rh.encode((*[hdrSize]byte)(buf[:hdrSize]))
		encodeHello(buf[hdrSize:], d.self())
		_, err := nc.Write(buf[:])
		return err
	}
	var ve *VersionError
	if errors.As(err, &ve) {
		// Tell the dialer our version so it can say what is wrong, then
		// wait (briefly) for it to hang up.
		if reply() == nil {
			if tc, ok := nc.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			io.Copy(io.Discard, io.LimitReader(nc, 1<<16))
		}
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	if h.typ != frameHello {
		return nil, fmt.Errorf("%w: first frame of type %d", errProtocol, h.typ)
	}
	if _, err := io.ReadFull(nc, buf[hdrSize:]); err != nil {
		return nil, err
	}
	peer, err := decodeHello(buf[hdrSize:])
	if err != nil {
		return nil, err
	}
	if err := reply(); err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return newConn(nc, peer), nil
}

// adopt registers a connection and starts its goroutines, unless the
// device is stopping.
func (d *device) adopt(c *conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.running {
		return false
	}
	d.conns[c] = struct{}{}
	d.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return true
}

// forget drops a failed connection from the device's tables.
func (d *device) forget(c *conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.conns, c)
	k := outKey{c.peer, c.stripe}
	dc := d.out[k]
	if dc == nil {
		return
	}
	// dc.c is written by the dialer once dc.done closes; a connection
	// that fails while still being dialed is dropped by the next
	// connTo, which finds it dead.
	select {
	case <-dc.done:
		if dc.c == c {
			delete(d.out, k)
		}
	default:
	}
}
