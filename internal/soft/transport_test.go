package soft

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakePeer is a hand-written peer on the wire, to send what a correct
// provider never would.
type fakePeer struct {
	t    *testing.T
	ln   net.Listener
	addr netip.AddrPort
}

const fakeQPN = 0x777

func newFakePeer(t *testing.T) *fakePeer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	return &fakePeer{t: t, ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort()}
}

func (f *fakePeer) address() verbs.Address {
	return verbs.Address{Port: 1, LID: f.addr.Port(), GID: verbs.GIDFromIP(f.addr.Addr()), HopLimit: 64}
}

// accept takes the provider's connection and answers its hello with a
// hello of the given version.
func (f *fakePeer) accept(version uint8) net.Conn {
	f.t.Helper()
	f.ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	nc, err := f.ln.Accept()
	must(f.t, err)
	f.t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	h, _ := readRaw(f.t, nc)
	if h.typ != frameHello {
		f.t.Fatalf("first frame %+v", h)
	}
	writeHello(f.t, nc, version, f.addr)
	return nc
}

func writeHello(t *testing.T, nc net.Conn, version uint8, addr netip.AddrPort) {
	t.Helper()
	var b [hdrSize + helloLen]byte
	h := header{typ: frameHello, length: helloLen}
	h.encode((*[hdrSize]byte)(b[:hdrSize]))
	b[4] = version
	encodeHello(b[hdrSize:], addr)
	_, err := nc.Write(b[:])
	must(t, err)
}

// dial connects to the provider's listener as a peer at f.addr.
func (f *fakePeer) dial(ctx verbs.Context) net.Conn {
	f.t.Helper()
	p := ctx.Info().Ports[0]
	nc, err := net.Dial("tcp", netip.AddrPortFrom(p.GIDs[0].GID.IP(), p.LID).String())
	must(f.t, err)
	f.t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	writeHello(f.t, nc, wireVersion, f.addr)
	if h, _ := readRaw(f.t, nc); h.typ != frameHello {
		f.t.Fatalf("reply %+v", h)
	}
	return nc
}

func writeRaw(t *testing.T, nc net.Conn, h header, payload []byte) {
	t.Helper()
	var b [hdrSize]byte
	h.encode(&b)
	if _, err := nc.Write(append(b[:], payload...)); err != nil {
		t.Fatal(err)
	}
}

func readRaw(t *testing.T, nc net.Conn) (header, []byte) {
	t.Helper()
	var b [hdrSize]byte
	var h header
	if err := readHeader(nc, &b, &h); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	p := make([]byte, h.length)
	_, err := io.ReadFull(nc, p)
	must(t, err)
	return h, p
}

// expectClosed waits for the provider to drop the connection.
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("connection not closed: %v", err)
	}
}

func TestVersionMismatchAtConnect(t *testing.T) {
	f := newFakePeer(t)
	a := newSide(t, sideOpt{})
	must(t, a.qp.ToInit(verbs.InitAttr{Port: 1}))
	must(t, a.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: fakeQPN, Dest: f.address()}))
	must(t, a.qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCount: 7}))
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: 4096, RKey: 1})
	f.accept(99)
	wc := poll(t, a.scq, 1)[0]
	if wc.Status != verbs.WCRetryExcErr || wc.VendorErr != VendorErrConnect {
		t.Fatalf("%+v", wc)
	}
	var ve *VersionError
	if err := QPError(a.qp); !errors.As(err, &ve) || ve.Got != 99 || !strings.Contains(err.Error(), "wire version 99") {
		t.Fatalf("QP error %v", err)
	}
}

func TestVersionMismatchAtAccept(t *testing.T) {
	ctx, err := Provider.Open(DeviceName)
	must(t, err)
	defer mustClose(t, ctx)
	p := ctx.Info().Ports[0]
	nc, err := net.Dial("tcp", netip.AddrPortFrom(p.GIDs[0].GID.IP(), p.LID).String())
	must(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	writeHello(t, nc, 2, netip.MustParseAddrPort("127.0.0.1:9"))
	var b [hdrSize]byte
	if _, err := io.ReadFull(nc, b[:prefixSize]); err != nil {
		t.Fatal(err)
	}
	if b[4] != wireVersion || b[5] != frameHello {
		t.Fatalf("reply % x", b[:prefixSize])
	}
	expectClosed(t, nc)
}

// fakeRequester connects QP b to the fake peer and has the fake dial in.
func fakeRequester(t *testing.T) (*side, net.Conn) {
	f := newFakePeer(t)
	b := newSide(t, sideOpt{})
	must(t, b.qp.ToInit(verbs.InitAttr{Port: 1, Access: verbs.AccessRemoteWrite}))
	must(t, b.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: fakeQPN, Dest: f.address(), MinRNRTimer: 1}))
	return b, f.dial(b.ctx)
}

func writeReq(b *side, psn uint32, n uint32) header {
	return header{typ: frameRequest, op: uint8(verbs.OpWrite), qpType: verbs.RC, dst: b.qp.QPN(), src: fakeQPN, psn: psn, length: n, key: b.mr.RKey(), addr: b.mr.Addr()}
}

func TestBadFramesFromRequester(t *testing.T) {
	t.Run("unknown QP", func(t *testing.T) {
		b, nc := fakeRequester(t)
		h := writeReq(b, 0, 4)
		h.dst = 0xfffff0
		writeRaw(t, nc, h, []byte{1, 2, 3, 4})
		r, _ := readRaw(t, nc)
		if r.typ != frameNak || r.op != nakUnknownQP || r.dst != fakeQPN {
			t.Fatalf("%+v", r)
		}
		waitState(t, b.qp, verbs.StateRTR)
	})
	t.Run("wrong peer QPN and PSN", func(t *testing.T) {
		b, nc := fakeRequester(t)
		h := writeReq(b, 0, 4)
		h.src = 0x778
		writeRaw(t, nc, h, []byte{1, 2, 3, 4})
		if r, _ := readRaw(t, nc); r.typ != frameNak || r.op != nakWrongPeer || r.dst != 0x778 {
			t.Fatalf("%+v", r)
		}
		writeRaw(t, nc, writeReq(b, 5, 4), []byte{1, 2, 3, 4})
		if r, _ := readRaw(t, nc); r.typ != frameNak || r.op != nakPSN {
			t.Fatalf("%+v", r)
		}
		writeRaw(t, nc, writeReq(b, 0, 4), []byte{9, 9, 9, 9})
		if r, _ := readRaw(t, nc); r.typ != frameAck || r.psn != 0 {
			t.Fatalf("%+v", r)
		}
		if b.buf[0] != 9 {
			t.Fatal("write not placed")
		}
	})
	for _, c := range []struct {
		name string
		send func(t *testing.T, b *side, nc net.Conn)
	}{
		{"garbage frame", func(t *testing.T, b *side, nc net.Conn) {
			h := writeReq(b, 1, 0)
			h.typ = 99
			writeRaw(t, nc, h, nil)
		}},
		{"reserved bits", func(t *testing.T, b *side, nc net.Conn) {
			var raw [hdrSize]byte
			h := writeReq(b, 1, 0)
			h.encode(&raw)
			raw[62] = 1
			nc.Write(raw[:])
		}},
		{"huge length", func(t *testing.T, b *side, nc net.Conn) {
			writeRaw(t, nc, writeReq(b, 1, 0x7fffffff), nil)
		}},
		{"truncated payload", func(t *testing.T, b *side, nc net.Conn) {
			writeRaw(t, nc, writeReq(b, 1, 1000), make([]byte, 10))
			nc.(*net.TCPConn).CloseWrite()
		}},
		{"truncated header", func(t *testing.T, b *side, nc net.Conn) {
			var raw [hdrSize]byte
			h := writeReq(b, 1, 0)
			h.encode(&raw)
			nc.Write(raw[:30])
			nc.(*net.TCPConn).CloseWrite()
		}},
		{"wrong version mid-stream", func(t *testing.T, b *side, nc net.Conn) {
			var raw [hdrSize]byte
			h := writeReq(b, 1, 0)
			h.encode(&raw)
			raw[4] = 7
			nc.Write(raw[:])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, nc := fakeRequester(t)
			b.postRecv(42, b.sge(0, 8))
			// One good WRITE first, then the bad frame.
			writeRaw(t, nc, writeReq(b, 0, 4), []byte{1, 2, 3, 4})
			if r, _ := readRaw(t, nc); r.typ != frameAck {
				t.Fatalf("%+v", r)
			}
			c.send(t, b, nc)
			expectClosed(t, nc)
			waitState(t, b.qp, verbs.StateError)
			if err := QPError(b.qp); err == nil || !(errors.Is(err, errProtocol) || errors.As(err, new(*VersionError))) {
				t.Fatalf("QP error %v", err)
			}
			if wc := poll(t, b.rcq, 1)[0]; wc.WRID != 42 || wc.Status != verbs.WCWRFlushErr {
				t.Fatalf("%+v", wc)
			}
		})
	}
}

// fakeResponder connects QP a to the fake peer and accepts its dial.
func fakeResponder(t *testing.T, timeout uint8) (*side, *fakePeer) {
	f := newFakePeer(t)
	a := newSide(t, sideOpt{})
	must(t, a.qp.ToInit(verbs.InitAttr{Port: 1}))
	must(t, a.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: fakeQPN, Dest: f.address()}))
	must(t, a.qp.ToRTS(verbs.RTSAttr{Timeout: timeout, RetryCount: 1, MaxRdAtomic: 4}))
	return a, f
}

func TestBadResponses(t *testing.T) {
	read := func(a *side) verbs.SendWR {
		return verbs.SendWR{ID: 1, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 64)}, RemoteAddr: 4096, RKey: 5}
	}
	for _, c := range []struct {
		name   string
		answer func(t *testing.T, nc net.Conn, req header)
		vendor uint32
	}{
		{"short READ response", func(t *testing.T, nc net.Conn, req header) {
			writeRaw(t, nc, header{typ: frameReadResp, dst: req.src, src: fakeQPN, psn: req.psn, length: 8}, make([]byte, 8))
		}, VendorErrProtocol},
		{"response for another PSN", func(t *testing.T, nc net.Conn, req header) {
			writeRaw(t, nc, header{typ: frameReadResp, dst: req.src, src: fakeQPN, psn: req.psn + 3, length: 64}, make([]byte, 64))
		}, VendorErrProtocol},
		{"atomic response to a READ", func(t *testing.T, nc net.Conn, req header) {
			writeRaw(t, nc, header{typ: frameAtomicResp, dst: req.src, src: fakeQPN, psn: req.psn}, nil)
		}, VendorErrProtocol},
		{"garbage", func(t *testing.T, nc net.Conn, req header) {
			nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n" + strings.Repeat("x", 64)))
		}, VendorErrProtocol},
		{"hang up", func(t *testing.T, nc net.Conn, req header) {
			nc.Close()
		}, VendorErrConnLost},
		{"silence", func(t *testing.T, nc net.Conn, req header) {}, VendorErrTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, f := fakeResponder(t, 10) // 4 ms × 2 tries: the 2 s floor
			a.post(read(a), verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: 4096, RKey: 5})
			nc := f.accept(wireVersion)
			req, _ := readRaw(t, nc)
			if req.typ != frameRequest || verbs.Opcode(req.op) != verbs.OpRead || req.compare != 64 {
				t.Fatalf("request %+v", req)
			}
			start := time.Now()
			c.answer(t, nc, req)
			wcs := poll(t, a.scq, 2)
			if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCRetryExcErr || wcs[0].VendorErr != c.vendor {
				t.Fatalf("%+v", wcs[0])
			}
			if wcs[1].WRID != 2 || wcs[1].Status != verbs.WCWRFlushErr {
				t.Fatalf("%+v", wcs[1])
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
			waitState(t, a.qp, verbs.StateError)
			t.Logf("QP error: %v", QPError(a.qp))
		})
	}
}

// TestUnknownQPAtPeer: a request for a QP the peer does not have moves
// the requester to ERR with a clear error.
func TestUnknownQPAtPeer(t *testing.T) {
	t.Setenv(EnvTransport, "tcp")
	a := newSide(t, sideOpt{})
	b := newSide(t, sideOpt{})
	connect(t, a, b, connOpt{})
	must(t, a.qp.ToReset())
	must(t, a.qp.ToInit(verbs.InitAttr{Port: 1}))
	must(t, a.qp.ToRTR(verbs.RTRAttr{PathMTU: verbs.MTU1024, DestQPN: 0xabcdef, Dest: b.addr()}))
	must(t, a.qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCount: 7}))
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.sge(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	if wc := poll(t, a.scq, 1)[0]; wc.Status != verbs.WCRetryExcErr || wc.VendorErr != VendorErrUnknownQP {
		t.Fatalf("%+v", wc)
	}
	if err := QPError(a.qp); err == nil || !strings.Contains(err.Error(), "unknown QP") {
		t.Fatalf("%v", err)
	}
}

// streamConn is a net.Conn that reads from a byte stream and discards
// writes, to drive a connection's reader without a socket.
type streamConn struct {
	io.Reader
}

func (streamConn) Write(p []byte) (int, error)      { return len(p), nil }
func (streamConn) Close() error                     { return nil }
func (streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (streamConn) SetDeadline(time.Time) error      { return nil }
func (streamConn) SetReadDeadline(time.Time) error  { return nil }
func (streamConn) SetWriteDeadline(time.Time) error { return nil }
func newStreamConn(r io.Reader, peer netip.AddrPort) *conn {
	c := newConn(streamConn{bufio.NewReader(r)}, peer)
	return c
}

// TestPosterWritesSmallWRs: a small WR on a connected QP goes to the
// network from PostSend's goroutine, without waking the worker (a
// goroutine hand-off on the way of every message); a large one, or the
// first, which dials, goes to the worker; and a WR the poster wrote still
// times out when the peer never answers.
func TestPosterWritesSmallWRs(t *testing.T) {
	a, f := fakeResponder(t, 10) // 4 ms × 2 tries: the 2 s floor
	q := a.qp.(*qp)
	handoffs := func() uint64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.handoffs
	}
	write := func(id uint64, n int) {
		a.post(verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, n)}, RemoteAddr: 4096, RKey: 5})
	}
	answer := func(nc net.Conn, id uint64, n int) {
		req, p := readRaw(t, nc)
		require.Equal(t, uint8(frameRequest), req.typ)
		require.Len(t, p, n)
		writeRaw(t, nc, header{typ: frameAck, dst: req.src, src: fakeQPN, psn: req.psn}, nil)
		wc := pollOK(t, a.scq)
		require.Equal(t, id, wc.WRID)
	}

	write(1, 8) // dials: the worker's
	nc := f.accept(wireVersion)
	answer(nc, 1, 8)
	require.EqualValues(t, 1, handoffs())

	for id := uint64(2); id < 22; id++ {
		write(id, 8)
		answer(nc, id, 8)
	}
	require.EqualValues(t, 1, handoffs(), "small WRs on a connected QP woke the worker")

	write(22, postRemoteMax+1)
	answer(nc, 22, postRemoteMax+1)
	require.EqualValues(t, 2, handoffs(), "a large WR is the worker's")

	start := time.Now()
	write(23, 8)
	req, _ := readRaw(t, nc)
	require.Equal(t, uint8(frameRequest), req.typ)
	wc := poll(t, a.scq, 1)[0] // never answered
	require.Equal(t, verbs.WCRetryExcErr, wc.Status)
	require.Equal(t, uint32(VendorErrTimeout), wc.VendorErr)
	require.Less(t, time.Since(start), 6*time.Second)
}

// TestBusyPeerIsAlive: a response that comes after the QP's timeout
// (2 s here) is taken, while the peer's process keeps sending other
// frames on the connection meanwhile: it is alive, only busy, as a
// server is that serves a burst over thousands of QPs before this
// one's request. A silent peer still times out (TestBadResponses).
func TestBusyPeerIsAlive(t *testing.T) {
	a, f := fakeResponder(t, 10) // 4 ms × 2 tries: the 2 s floor
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 64)}, RemoteAddr: 4096, RKey: 5})
	nc := f.accept(wireVersion)
	req, _ := readRaw(t, nc)
	// Traffic of the peer's other QPs for 3 s: requests to QPs this side
	// does not have, which it answers with NAKs.
	stop := time.Now().Add(3 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(stop) {
		<-tick.C
		writeRaw(t, nc, header{typ: frameRequest, op: uint8(verbs.OpWrite), qpType: verbs.RC, dst: 0xfffff0, src: 0x778, length: 4}, []byte{1, 2, 3, 4})
		if r, _ := readRaw(t, nc); r.typ != frameNak || r.op != nakUnknownQP {
			t.Fatalf("answer to another QP's request: %+v", r)
		}
		if st, _ := a.qp.State(); st == verbs.StateError {
			t.Fatalf("the QP timed out while its peer was sending: %v", QPError(a.qp))
		}
	}
	writeRaw(t, nc, header{typ: frameReadResp, dst: req.src, src: fakeQPN, psn: req.psn, length: 64}, make([]byte, 64))
	if wc := poll(t, a.scq, 1)[0]; wc.WRID != 1 || wc.Status != verbs.WCSuccess {
		t.Fatalf("the READ answered late: %+v", wc)
	}
}

// TestStarvedReaderIsNoTimeout: a response that waits unread in this
// side's socket past the QP's timeout (the process's reader starved of
// CPU, here held) is not the peer's silence: the QP does not time out,
// and takes the response once its reader runs. A silent peer still
// times out (TestBadResponses).
func TestStarvedReaderIsNoTimeout(t *testing.T) {
	a, f := fakeResponder(t, 10) // 4 ms × 2 tries: the 2 s floor
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.sge(0, 64)}, RemoteAddr: 4096, RKey: 5})
	nc := f.accept(wireVersion)
	req, _ := readRaw(t, nc)
	// Hold a's reader before the response comes: it waits in the socket.
	q := a.qp.(*qp)
	q.mu.Lock()
	c := q.conn
	q.mu.Unlock()
	require.NotNil(t, c, "a's QP has no connection")
	stall := &stallHook{reached: make(chan struct{}), release: make(chan struct{})}
	c.stall.Store(stall)
	// The reader waits in a read now: a frame it serves brings it to the
	// stall, before its next frame.
	writeRaw(t, nc, header{typ: frameRequest, op: uint8(verbs.OpWrite), qpType: verbs.RC, dst: 0xfffff0, src: 0x778, length: 4}, []byte{1, 2, 3, 4})
	select {
	case <-stall.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never reached the stall")
	}
	writeRaw(t, nc, header{typ: frameReadResp, dst: req.src, src: fakeQPN, psn: req.psn, length: 64}, make([]byte, 64))
	assert.Never(t, func() bool { st, _ := a.qp.State(); return st == verbs.StateError }, 3*time.Second, 50*time.Millisecond,
		"the QP timed out with its peer's answer unread in its own socket")
	close(stall.release)
	if wc := poll(t, a.scq, 1)[0]; wc.WRID != 1 || wc.Status != verbs.WCSuccess {
		t.Fatalf("the READ: %+v", wc)
	}
}
