package rdma

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The out-of-band handshake runs over the TCP connection that Dial opens
// and Listen accepts. Each side sends a hello; the listener answers with
// its own hello or a refusal. Then both move their QPs to RTS and send one
// ready byte, so neither side sends before the other's receives are
// posted. The TCP connection stays open afterwards as the control channel
// (regions, region requests, orderly close) and as a liveness signal.

const (
	handshakeMagic   = "GO-RDMA\x00"
	handshakeVersion = 8
	maxReason        = 512
)

// ErrVersion means the peer speaks another version of the handshake.
var ErrVersion = errors.New("peer speaks another go-rdma protocol version")

// ErrNotRDMA means the peer did not answer with a go-rdma handshake.
var ErrNotRDMA = errors.New("peer is not a go-rdma endpoint")

// ErrRefused means the peer refused the connection; the error says why.
var ErrRefused = errors.New("connection refused by peer")

// hello is what each side tells the other about its queue pair.
type hello struct {
	Magic   [8]byte
	Version uint16
	// EOL is "\r\n" (zeros from a peer before v0.2.0; it is not read):
	// a line-based server dialed by mistake, HTTP's above all, reads the
	// bytes before it as a malformed request line and answers at once,
	// so the dial fails in a round trip instead of at the handshake's
	// bound (readAnswer).
	EOL       [2]byte
	Provider  [8]byte // "verbs" or "soft"
	QPN       uint32
	PSN       uint32
	LID       uint16
	MTU       uint8
	Flags     uint8
	GID       verbs.GID
	RecvDepth uint32 // the sender's credit cap: the most messages it takes in flight
	MaxMsg    uint32 // largest SEND the sender accepts
	// The sender's credit word (creditWord): the peer writes the
	// credits it gives there. Zero on connections without credits.
	CreditAddr uint64
	CreditRKey uint32
	RecvWindow uint32 // the sender's Conn.RecvWindow
	// The application protocol the sender speaks on the connection
	// (WithProtocol), NUL-padded; all zero for the plain async API.
	Protocol [maxProtocol]byte
}

func providerName(b [8]byte) string {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	return string(b[:n])
}

func writeHello(w io.Writer, h *hello) error {
	copy(h.Magic[:], handshakeMagic)
	h.Version = handshakeVersion
	h.EOL = [2]byte{'\r', '\n'}
	return binary.Write(w, binary.BigEndian, h)
}

// readHello reads and checks a hello. A peer that is no go-rdma endpoint,
// or speaks another version, gets a clear error.
func readHello(r io.Reader) (*hello, error) {
	var h hello
	if err := binary.Read(r, binary.BigEndian, &h); err != nil {
		return nil, handshakeReadErr("hello", err, false)
	}
	if string(h.Magic[:]) != handshakeMagic {
		return nil, fmt.Errorf("%w: bad handshake magic %q", ErrNotRDMA, h.Magic[:])
	}
	if h.Version != handshakeVersion {
		return nil, fmt.Errorf("%w: peer version %d, ours %d", ErrVersion, h.Version, handshakeVersion)
	}
	return &h, nil
}

// handshakeReadErr explains a failed read of the handshake's what, so
// that a peer that is silent, one that went away and one that speaks
// something else read differently:
//   - the bound ran out (WithHandshakeTimeout, or the context's deadline,
//     which Dial then names): it matches os.ErrDeadlineExceeded;
//   - the peer closed or reset the socket: ErrPeerClosed. Before the
//     peer's hello that may also be a server of another protocol giving
//     up on ours, so it matches ErrNotRDMA as well, unless known (the
//     peer's hello came) to be a go-rdma endpoint;
//   - anything else is ErrNotRDMA.
func handshakeReadErr(what string, err error, goRDMA bool) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("rdma: no %s from the peer within the handshake's bound: %w", what, err)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET):
		if goRDMA {
			return fmt.Errorf("rdma: %w before its %s (it died or gave up)", ErrPeerClosed, what)
		}
		return fmt.Errorf("rdma: %w before its %s: it died, gave up, or %w", ErrPeerClosed, what, ErrNotRDMA)
	}
	return fmt.Errorf("%w: no %s: %v", ErrNotRDMA, what, err)
}

// Answers of the listener to a hello.
const (
	answerAccept = 0
	answerRefuse = 1
)

func writeRefusal(w io.Writer, reason string) error {
	// The dialer says "rdma" and "refused" itself (readAnswer).
	reason = strings.TrimPrefix(strings.TrimPrefix(reason, "rdma: "), ErrRefused.Error()+": ")
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, 0, 3+len(reason))
	b = append(b, answerRefuse)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	b = append(b, reason...)
	_, err := w.Write(b)
	return err
}

// readAnswer reads the listener's answer: its hello, or a refusal.
func readAnswer(r *bufio.Reader) (*hello, error) {
	kind, err := r.ReadByte()
	if err != nil {
		return nil, handshakeReadErr("answer to the handshake", err, false)
	}
	switch kind {
	case answerAccept:
		return readHello(r)
	case answerRefuse:
		var n uint16
		if err := binary.Read(r, binary.BigEndian, &n); err != nil || n > maxReason {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		reason := make([]byte, n)
		if _, err := io.ReadFull(r, reason); err != nil {
			return nil, fmt.Errorf("%w: malformed refusal", ErrNotRDMA)
		}
		return nil, fmt.Errorf("rdma: %w: the listener says: %q", ErrRefused, reason)
	}
	r.UnreadByte()
	return nil, otherAnswer(r)
}

// maxOtherAnswer bounds what an error quotes of a server of another
// protocol's answer.
const maxOtherAnswer = 64

// otherAnswer is the error for an answer that is no go-rdma answer: it
// quotes the first bytes that came (what r holds already; waiting for
// more could wait for the handshake's bound), naming an HTTP server as
// such.
func otherAnswer(r *bufio.Reader) error {
	b, _ := r.Peek(min(r.Buffered(), maxOtherAnswer))
	if bytes.HasPrefix(b, []byte("HTTP/")) {
		if i := bytes.IndexByte(b, '\r'); i >= 0 {
			b = b[:i] // its status line
		}
		return fmt.Errorf("%w: an HTTP server answered: %q (dialed its port instead of the listener's?)", ErrNotRDMA, b)
	}
	return fmt.Errorf("%w: the peer answered %q", ErrNotRDMA, b)
}

// dialHandshake is Dial's side of the handshake over tc: its queue pair
// exists before its hello, which names it. It closes tc on failure.
func dialHandshake(ctx context.Context, eng *engine, cfg config, tc net.Conn) (*conn, error) {
	release := bound(ctx, tc, cfg.setup)
	defer release()
	if cfg.tls != nil {
		var err error
		if tc, err = startTLS(ctx, tc, cfg.tls); err != nil {
			return nil, err
		}
	}
	c, err := newConn(eng, cfg, tc, tc.LocalAddr(), tc.RemoteAddr())
	if err != nil {
		tc.Close()
		return nil, err
	}
	me, err := c.prepare()
	if err == nil {
		err = writeHello(tc, &me)
	}
	br := bufio.NewReaderSize(tc, ctrlReadBuffer)
	var peer *hello
	if err == nil && cfg.tls != nil {
		err = tlsAnswered(tc, br)
	}
	if err == nil {
		peer, err = readAnswer(br)
	}
	if err == nil {
		err = sameProvider(eng, peer)
	}
	if err == nil {
		err = sameProtocol(cfg.protocol, peer, true)
	}
	if err == nil {
		err = c.connect(br, &me, peer, release)
	}
	if err != nil {
		c.abort()
		return nil, err
	}
	return c, nil
}

// sameProvider refuses a peer on another provider: a soft QP cannot
// talk to a verbs one.
func sameProvider(eng *engine, peer *hello) error {
	if p := providerName(peer.Provider); p != eng.Prov.Name() {
		return fmt.Errorf("%w: peer uses provider %q, this side %q", ErrRefused, p, eng.Prov.Name())
	}
	return nil
}

// ctrlReadBuffer is the size of the buffered reader of a connection's
// TCP socket: hellos and control frames are small.
const ctrlReadBuffer = 512

// readPeerHello is the listener's first step: it reads and checks the
// dialer's hello, and refuses (telling the dialer why) a hello it cannot
// serve. Nothing costly exists yet: no queue pair, no receive, no
// registered memory.
func readPeerHello(eng *engine, cfg *config, tc net.Conn, br *bufio.Reader) (*hello, error) {
	peer, err := readHello(br)
	if err == nil {
		err = sameProvider(eng, peer)
	}
	if err == nil {
		err = sameProtocol(cfg.protocol, peer, false)
	}
	if err != nil {
		writeRefusal(tc, err.Error())
		return nil, err
	}
	return peer, nil
}

// acceptConn is the listener's side after a valid hello: it makes the
// connection and answers. A failure here is sent to the dialer as a
// refusal, so it learns why instead of seeing the socket close. From
// its answer on it waits on the dialer, and calls waiting first. It
// closes tc on failure.
func acceptConn(eng *engine, cfg config, tc net.Conn, br *bufio.Reader, peer *hello, release func() bool, waiting func()) (*conn, error) {
	c, err := newConn(eng, cfg, tc, tc.LocalAddr(), tc.RemoteAddr())
	if err != nil {
		writeRefusal(tc, err.Error())
		tc.Close()
		return nil, err
	}
	me, err := c.prepare()
	if err != nil {
		writeRefusal(tc, err.Error())
		c.abort()
		return nil, err
	}
	_, err = tc.Write([]byte{answerAccept})
	if err == nil {
		err = writeHello(tc, &me)
	}
	if err == nil {
		waiting()
		err = c.connect(br, &me, peer, release)
	}
	if err != nil {
		c.abort()
		return nil, err
	}
	return c, nil
}

// bound limits the handshake on tc to d and to ctx. release lifts both;
// it reports false if ctx ended first (tc then stays bounded, so that its
// reads fail; a deadline set after release overrides that bound). Calling
// it again does nothing. The socket's deadline is d alone: ctx's deadline
// ends the handshake through ctx, so that by the time a read fails,
// ctx.Err() says so (a socket deadline set to ctx's could fire first, and
// the dial would not match context.DeadlineExceeded).
func bound(ctx context.Context, tc net.Conn, d time.Duration) (release func() bool) {
	tc.SetDeadline(time.Now().Add(d))
	cut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		tc.SetDeadline(time.Unix(1, 0))
		close(cut)
	})
	var once sync.Once
	var ok bool
	return func() bool {
		once.Do(func() {
			if ok = stop(); ok {
				tc.SetDeadline(time.Time{})
			} else {
				<-cut
			}
		})
		return ok
	}
}

// prepare moves the new QP to INIT, posts its receives and returns the
// hello that describes it.
func (c *conn) prepare() (hello, error) {
	eng, cfg := c.eng, c.cfg
	if err := c.qp.ToInit(verbs.InitAttr{Port: eng.Port.Port, Access: verbs.Access(RemoteRead | RemoteWrite | RemoteAtomic)}); err != nil {
		return hello{}, err
	}
	if err := c.postReceives(); err != nil {
		return hello{}, err
	}
	if err := c.makeCreditWord(); err != nil {
		return hello{}, err
	}
	gid, err := eng.GIDFor(addrIP(c.ctl.ctrl.LocalAddr()))
	if err != nil {
		return hello{}, err
	}
	c.gidIndex = uint8(gid.Index)
	me := hello{QPN: c.qp.QPN(), PSN: randPSN(), LID: eng.Port.LID, MTU: uint8(eng.Port.ActiveMTU), GID: gid.GID,
		RecvDepth: uint32(c.recvCap()), MaxMsg: uint32(cfg.maxMsg), RecvWindow: uint32(c.api.RecvWindow())}
	copy(me.Protocol[:], cfg.protocol)
	if c.cr.cw.mr != nil {
		me.CreditAddr, me.CreditRKey = c.cr.cw.mr.Addr(), c.cr.cw.mr.RKey()
	}
	if me.MTU == 0 {
		me.MTU = uint8(verbs.MTU1024)
	}
	copy(me.Provider[:], eng.Prov.Name())
	return me, nil
}

// connect moves the QP to RTS towards peer, then both sides send one
// ready byte, so neither sends before the other's receives are posted;
// then the control channel starts.
func (c *conn) connect(br *bufio.Reader, me, peer *hello, release func() bool) error {
	eng := c.eng
	c.peer = *peer
	// No credits yet: the first message asks for them (askCredits).
	mtu := verbs.MTU(min(me.MTU, peer.MTU))
	if err := c.qp.ToRTR(verbs.RTRAttr{PathMTU: mtu, DestQPN: peer.QPN, RQPSN: peer.PSN,
		Dest: verbs.Address{Port: eng.Port.Port, LID: peer.LID, GID: peer.GID, SGIDIndex: c.gidIndex}, MinRNRTimer: 12}); err != nil {
		return err
	}
	if err := c.qp.ToRTS(verbs.RTSAttr{SQPSN: me.PSN, Timeout: 14, RetryCount: 7, RNRRetry: 7}); err != nil {
		return err
	}
	var ready [1]byte
	if _, err := c.ctl.ctrl.Write(ready[:]); err != nil {
		return err
	}
	if _, err := io.ReadFull(br, ready[:]); err != nil {
		return handshakeReadErr("ready", err, true)
	}
	if !release() {
		return fmt.Errorf("rdma: handshake with %v: %w", c.remote, context.Canceled)
	}
	c.logConnected()
	go c.readControl(br)
	return nil
}

// abort tears down a connection whose handshake failed.
func (c *conn) abort() {
	close(c.ctl.ctrlDone)
	c.teardown()
}
