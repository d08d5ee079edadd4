package soft

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
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
	// ioChunk is the most read or written under one deadline.
	ioChunk = 1 << 20
	// directWrite: payloads this large bypass the write buffer; they go
	// out with the buffered frames in one writev.
	directWrite = 16 << 10
	wbufSize    = 64 << 10
	// rbufSize is small so that large payloads are read straight into
	// registered memory, not through the buffer.
	rbufSize = 8 << 10
	// maxQueuedResp bounds the responses waiting to be written on one
	// connection; a peer that floods us past it is cut off.
	maxQueuedResp = 1 << 16
)

// conn is a TCP connection to another soft provider. A provider sends its
// requests on connections it dialed and answers requests on the
// connection they came from. Each connection has a reader goroutine
// (requests and responses) and a writer goroutine (responses); QP workers
// write their requests themselves.
type conn struct {
	nc      net.Conn
	peer    netip.AddrPort // the peer's listener address, as QPs name it
	peerGID verbs.GID

	br    *bufio.Reader
	h     header
	rhdr  [hdrSize]byte
	rdl   time.Time
	rscr  respScratch
	rsrc  streamSource
	rdead atomic.Bool

	wmu   sync.Mutex
	wbuf  []byte // small frames not yet written
	wvec  net.Buffers
	wback [2][]byte
	whdr  [hdrSize]byte
	wdl   time.Time

	mu   sync.Mutex
	dead bool
	resp []respEntry
	wake chan struct{}
	done chan struct{}
}

type respEntry struct {
	h    header
	mr   *mr
	data []byte
}

func newConn(nc net.Conn, peer netip.AddrPort) *conn {
	c := &conn{
		nc: nc, peer: peer, peerGID: verbs.GIDFromIP(peer.Addr()),
		br: bufio.NewReaderSize(nc, rbufSize), wbuf: make([]byte, 0, wbufSize),
		rscr: newRespScratch(),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	c.rsrc = streamSource{c: c, r: c.br}
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
	// An idle connection may wait for ever; once a frame has begun, each
	// chunk of it must arrive within ioTimeout.
	c.armRead()
	if _, err := c.br.Peek(1); err != nil {
		if isTimeout(err) {
			return nil
		}
		return err
	}
	c.armRead()
	h := &c.h
	*h = header{}
	err := readHeader(c.br, &c.rhdr, h)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = streamErr("header", err)
	}
	if err == nil {
		switch h.typ {
		case frameRequest:
			err = c.onRequest(h)
		case frameHello:
			err = fmt.Errorf("%w: hello in the middle of a connection", errProtocol)
		default:
			err = c.onResponse(h)
		}
	}
	handleOverflows()
	return err
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
	if err := q.onResponse(c, h, &c.rscr.sgl, src); err != nil {
		return err
	}
	return src.discard()
}

// queue hands a response to the writer goroutine. A READ response holds
// its MR until written.
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
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
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
		c.mu.Lock()
		batch, c.resp = c.resp, batch[:0]
		c.mu.Unlock()
		err := c.writeResponses(batch)
		for i := range batch {
			if batch[i].mr != nil {
				batch[i].mr.refs.release()
			}
			batch[i] = respEntry{}
		}
		if err != nil {
			c.fail(err, false)
			return
		}
	}
}

func (c *conn) writeResponses(batch []respEntry) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i := range batch {
		e := &batch[i]
		e.h.encode(&c.whdr)
		if err := c.put(c.whdr[:]); err != nil {
			return err
		}
		if err := c.writePayload(e.data); err != nil {
			return err
		}
	}
	return c.flushLocked()
}

// writeRequest writes one request frame; the caller flushes. Caller must
// not hold wmu.
func (c *conn) writeRequest(h *header, s *sendSlot, w *sgl) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	h.encode(&c.whdr)
	if err := c.put(c.whdr[:]); err != nil {
		return err
	}
	if h.length == 0 {
		return nil
	}
	if s.isInline {
		return c.writePayload(s.inline)
	}
	for _, b := range w.bufs {
		if err := c.writePayload(b); err != nil {
			return err
		}
	}
	return nil
}

// put buffers small data. Caller holds wmu.
func (c *conn) put(p []byte) error {
	if len(c.wbuf)+len(p) > cap(c.wbuf) {
		if err := c.flushLocked(); err != nil {
			return err
		}
	}
	c.wbuf = append(c.wbuf, p...)
	return nil
}

// writePayload writes b: small payloads into the buffer, large ones
// straight from registered memory, the first chunk together with the
// buffered frames in one writev, each chunk under a fresh deadline.
// Caller holds wmu.
func (c *conn) writePayload(b []byte) error {
	if len(b) < directWrite {
		return c.put(b)
	}
	for len(b) > 0 {
		n := min(len(b), ioChunk)
		c.armWrite()
		var err error
		if len(c.wbuf) > 0 {
			c.wvec = append(c.wback[:0], c.wbuf, b[:n])
			_, err = c.wvec.WriteTo(c.nc)
			c.wback = [2][]byte{}
			c.wbuf = c.wbuf[:0]
		} else {
			_, err = c.nc.Write(b[:n])
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// flushLocked writes the buffered frames. Caller holds wmu.
func (c *conn) flushLocked() error {
	if len(c.wbuf) == 0 {
		return nil
	}
	c.armWrite()
	_, err := c.nc.Write(c.wbuf)
	c.wbuf = c.wbuf[:0]
	return err
}

func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.flushLocked()
}

// dialCall is one connection attempt that concurrent senders share.
type dialCall struct {
	done chan struct{}
	c    *conn
	err  error
}

// connTo returns a live connection to peer, dialing if needed.
func (d *device) connTo(peer netip.AddrPort) (*conn, error) {
	for {
		d.mu.Lock()
		if !d.running {
			d.mu.Unlock()
			return nil, fmt.Errorf("soft: device closed: %w", net.ErrClosed)
		}
		if dc := d.out[peer]; dc != nil {
			d.mu.Unlock()
			<-dc.done
			if dc.err != nil {
				return nil, dc.err
			}
			if !dc.c.isDead() {
				return dc.c, nil
			}
			d.mu.Lock()
			if d.out[peer] == dc {
				delete(d.out, peer)
			}
			d.mu.Unlock()
			continue
		}
		dc := &dialCall{done: make(chan struct{})}
		d.out[peer] = dc
		d.mu.Unlock()
		dc.c, dc.err = d.dial(peer)
		if dc.err != nil {
			d.mu.Lock()
			if d.out[peer] == dc {
				delete(d.out, peer)
			}
			d.mu.Unlock()
		}
		close(dc.done)
		return dc.c, dc.err
	}
}

func (d *device) dial(peer netip.AddrPort) (*conn, error) {
	nc, err := net.DialTimeout("tcp", peer.String(), dialTimeout)
	if err != nil {
		return nil, fmt.Errorf("soft: connect to peer %s: %w", peer, err)
	}
	if err := d.handshake(nc, peer); err != nil {
		nc.Close()
		return nil, err
	}
	c := newConn(nc, peer)
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
	dc := d.out[c.peer]
	if dc == nil {
		return
	}
	// dc.c is written by the dialer once dc.done closes; a connection
	// that fails while still being dialed is dropped by the next
	// connTo, which finds it dead.
	select {
	case <-dc.done:
		if dc.c == c {
			delete(d.out, c.peer)
		}
	default:
	}
}
