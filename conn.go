package rdma

import (
	"context"
	"fmt"
	"net"
	"runtime"

	"github.com/go-rdma/rdma/internal/rc"

	"github.com/go-rdma/rdma/internal/pool"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Conn is a reliable connection (an RC queue pair) to one peer. Its
// operations return Futures; they are safe to call from many goroutines.
//
// Completions are polled by the pollers of the connection's engine: the
// Engine it was made on, or the engine the package-level Dial and Listen
// share between connections of the same engine settings (see Engine). No
// OS thread blocks per connection.
type Conn struct {
	*conn // the connection itself; Conn declares the API and nothing else
}

// conn is the API's side of one reliable connection (rc.Conn): the
// engine and settings it was made with, and what its set-up keeps.
// Conn, the API, embeds it; api is the Conn users hold, in the same
// allocation.
type conn struct {
	api   Conn
	rc    rc.Conn
	eng   *engine
	cfg   config // the connection's own settings (queue depths, sizes, limits)
	local net.Addr
	iw    iwarpSettle // the READ that settles an rdma_cm connection on iWARP (settleIWARP)
	tcp   *tcpSide    // the socket of a connection that fell back to TCP; nil on RDMA ones
}

// Dial connects to a Listener at address ("host:port") over network
// "rdma". The TCP connection used for the handshake stays open as the
// control channel.
func Dial(ctx context.Context, network, address string, opts ...Option) (*Conn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg := defaultConfig()
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	return dial(ctx, nil, cfg, address)
}

// dial connects to address on eng, or, when eng is nil, on the shared
// engine of the device that serves the connection's local address.
func dial(ctx context.Context, eng *engine, cfg config, address string) (*Conn, error) {
	const network = "rdma"
	if err := cfg.checkSecurity(true); err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	cfg.tls = clientTLSConfig(cfg.tls, address)
	if cfg.cm {
		c, err := dialCM(ctx, eng, cfg, address)
		if err != nil {
			if eng != nil { // a shared engine is dialCM's own: not counted
				eng.lifecycle.handshake(err)
			}
			return nil, &net.OpError{Op: "dial", Net: network, Err: asTimeout(err)}
		}
		return c.public(), nil
	}
	var d net.Dialer
	tc, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	if eng, err = engineFor(eng, cfg, rc.AddrIP(tc.LocalAddr())); err != nil {
		tc.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Addr: tc.RemoteAddr(), Err: err}
	}
	if err := eng.Lacks(verbs.FeatureManualConnect); err != nil {
		eng.Release()
		tc.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Addr: tc.RemoteAddr(), Err: fmt.Errorf("rdma: %w; dial and listen WithRDMACM", err)}
	}
	c, err := dialHandshake(ctx, eng, cfg, tc)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		eng.lifecycle.handshake(err)
	}
	eng.Release() // the connection holds its own reference
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: tc.RemoteAddr(), Err: asTimeout(err)}
	}
	return c.public(), nil
}

// newConn makes a connection on eng with its QP created (in RESET) and
// room reserved in a CQ for every WR it can have outstanding. On error
// nothing is left behind.
func newConn(eng *engine, cfg config, ctrl net.Conn, local, remote net.Addr) (*conn, error) {
	c := &conn{eng: eng, cfg: cfg, local: local}
	c.api.conn = c
	rcfg := rc.Config{SendDepth: cfg.sqDepth, RecvDepth: cfg.rqDepth, SendLimit: cfg.sendQueueLimit(), MaxMsg: cfg.maxMsg,
		Handled: cfg.handler != nil, MaxExpose: cfg.maxExpose, RegionLife: cfg.regionLife, CM: cfg.cm, UC: cfg.transport == UC, Setup: cfg.setup, Protocol: cfg.protocol}
	if err := c.rc.Init(eng.Engine, rcfg, ctrl, remote, (*shell)(c)); err != nil {
		return nil, err
	}
	return c, nil
}

// public is the Conn users hold for c.
func (c *conn) public() *Conn { return &c.api }

// LocalAddr is the local address of the connection's control channel.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.rc.Remote }

// Provider is "verbs" or "soft".
func (c *Conn) Provider() string { return c.eng.Prov.Name() }

// Device is the name of the device the connection uses.
func (c *Conn) Device() string { return c.eng.Name() }

// MaxMessage is the largest message Send may carry to the peer.
func (c *Conn) MaxMessage() int { return int(c.rc.Peer.MaxMsg) }

// Alloc returns n bytes of registered memory, zero to its capacity, from
// the pool of the connection's engine: the buffer works on every
// connection of that engine.
func (c *Conn) Alloc(n int) (*Buffer, error) {
	if c.rc.Life.Err() != nil {
		return nil, c.rc.Life.ClosedErr()
	}
	return c.eng.alloc(n)
}

// Done is closed when the connection has ended (closed here, failed, or
// its peer closed, died or aborted) and every message that arrived
// before the end was handed over, as TCP's EOF comes after the data. No
// operation needs to be posted to learn it. What a caller may rely on:
//   - With a RecvHandler: Done closes only after the handler has
//     returned for every message that arrived, so closing the
//     connection on Done loses none. (A handler must therefore not wait
//     for Done of its own connection.)
//   - With Recv: messages that arrived and no Recv took yet keep Done
//     open; Recv still returns them, in order, and Done closes once the
//     last is taken. Recvs after that fail with why it ended (Err).
//   - After Close here Done is closed when Close returns; what no Recv
//     took is dropped (see Close).
func (c *Conn) Done() <-chan struct{} {
	if c.tcp != nil {
		return c.tcp.done
	}
	return c.rc.Done()
}

// Err is nil while the connection is up; once it has ended (which may
// be before Done closes, while messages that arrived wait to be taken)
// it says why: an error wrapping ErrClosed after Close, ErrPeerClosed
// when the peer closed or aborted (then the text says the peer's
// reason), ErrPeerLost when it went away without either (killed,
// crashed, its host or the network down), or the failure that ended it.
func (c *Conn) Err() error { return c.rc.Life.Err() }

// Send sends the bytes of b as one message; the peer gets them from Recv.
// b may be released before the future resolves; up to 64 bytes go inline
// (copied at the call), so b may also change as soon as Send returns.
// Send never blocks: past
// the connection's WithSendQueueLimit of operations issued and not
// completed (a peer that does not read) the future fails at once with
// ErrQueueFull.
func (c *Conn) Send(b Local) *Future { return c.sendOp(verbs.OpSend, b, 0) }

// SendWithImm sends b with a 32-bit immediate value that the peer's Recv
// reports.
func (c *Conn) SendWithImm(b Local, imm uint32) *Future { return c.sendOp(verbs.OpSendWithImm, b, imm) }

func (c *conn) sendOp(opc verbs.Opcode, b Local, imm uint32) *Future {
	var o rc.Op
	var wr verbs.SendWR
	if err := c.sendRequest(&o, &wr, opc, b, imm); err != nil {
		return newResolved(err)
	}
	f := c.issue(&o, &wr)
	runtime.KeepAlive(b) // the handle's cleanup must not run before the post took its reference
	return f
}

// issue posts, signaled, an operation that its check (sendRequest,
// rdmaRequest) made.
func (c *conn) issue(o *rc.Op, wr *verbs.SendWR) *Future {
	wr.Flags |= verbs.SendSignaled
	c.rc.Counters.Issued(wr.Opcode, o.N)
	return c.post(o, wr)
}

// sendRequest checks a message of src and fills in its op and its WR,
// unsignaled: for Send and for a Batch's Send alike. It fills o and wr
// rather than returning them: the post path passes them down by pointer,
// and these structs, a few hundred bytes, copied at each step cost a
// lone 8-byte operation a tenth of its time.
func (c *conn) sendRequest(o *rc.Op, wr *verbs.SendWR, opc verbs.Opcode, src Local, imm uint32) error {
	if c.tcp != nil { // the opcode's name only when it is needed
		return c.refuseOnTCP(opc.String())
	}
	if opc == verbs.OpSendWithImm {
		if err := c.eng.Lacks(verbs.FeatureImmediate); err != nil {
			return fmt.Errorf("rdma: %v: %w", opc, err)
		}
	}
	pb, off, n, err := local(src)
	if err != nil {
		return err
	}
	if n > int(c.rc.Peer.MaxMsg) {
		return fmt.Errorf("rdma: send of %d bytes: %w: the peer accepts messages up to %d bytes", n, ErrInvalid, c.rc.Peer.MaxMsg)
	}
	*o = rc.Op{Kind: rc.OpSend, Buf: pb, Off: off, N: n}
	*wr = verbs.SendWR{Opcode: opc, Flags: c.inlineFlag(opc, n), Imm: imm}
	return nil
}

// inlineFlag is SendInline for a SEND or WRITE of n bytes that fits the
// inline size the QP was granted (up to 64 bytes): the device copies the
// bytes at the post, so no DMA read of the source follows, and the
// source may change as soon as the call returns.
func (c *conn) inlineFlag(opc verbs.Opcode, n int) verbs.SendFlags {
	if n > 0 && n <= c.rc.Inline && opc != verbs.OpRead {
		return verbs.SendInline
	}
	return 0
}

// Write writes the bytes of src to the start of dst in the peer's
// memory. dst must be at least as long as src. Up to 64 bytes go inline
// (copied at the call): src may change as soon as Write returns.
func (c *Conn) Write(src Local, dst RemoteRegion) *Future {
	return c.rdmaOp(rc.OpWrite, verbs.OpWrite, src, dst, 0)
}

// WriteWithImm writes like Write, then delivers imm to one of the peer's
// Recv calls (whose future has no buffer and reports the written length).
func (c *Conn) WriteWithImm(src Local, dst RemoteRegion, imm uint32) *Future {
	return c.rdmaOp(rc.OpWrite, verbs.OpWriteWithImm, src, dst, imm)
}

// Read reads len(dst) bytes from the start of src in the peer's memory
// into dst.
func (c *Conn) Read(dst Local, src RemoteRegion) *Future {
	return c.rdmaOp(rc.OpRead, verbs.OpRead, dst, src, 0)
}

func (c *conn) rdmaOp(kind rc.OpKind, opc verbs.Opcode, l Local, r RemoteRegion, imm uint32) *Future {
	var o rc.Op
	var wr verbs.SendWR
	if err := c.rdmaRequest(&o, &wr, kind, opc, l, r, imm); err != nil {
		return newResolved(err)
	}
	f := c.issue(&o, &wr)
	runtime.KeepAlive(l) // the handle's cleanup must not run before the post took its reference
	return f
}

// rdmaRequest checks a WRITE or READ between l and r and fills in its op
// and its WR, unsignaled, as sendRequest does: for the Conn's operations
// and a Batch's alike.
func (c *conn) rdmaRequest(o *rc.Op, wr *verbs.SendWR, kind rc.OpKind, opc verbs.Opcode, l Local, r RemoteRegion, imm uint32) error {
	if err := c.refuseOnUC(opc); err != nil {
		return err
	}
	if opc == verbs.OpWriteWithImm {
		if err := c.eng.Lacks(verbs.FeatureImmediate); err != nil {
			return fmt.Errorf("rdma: %v: %w", opc, err)
		}
	}
	pb, off, n, err := local(l)
	if err != nil {
		return err
	}
	if n > r.Len {
		return fmt.Errorf("rdma: %v of %d bytes into a %d-byte remote region: %w", opc, n, r.Len, ErrInvalid)
	}
	if n == 0 && opc != verbs.OpWriteWithImm {
		return fmt.Errorf("rdma: %v of 0 bytes: %w", opc, ErrInvalid)
	}
	*o = rc.Op{Kind: kind, Buf: pb, Off: off, N: n}
	*wr = verbs.SendWR{Opcode: opc, Flags: c.inlineFlag(opc, n), Imm: imm, RemoteAddr: r.Addr, RKey: r.RKey}
	return nil
}

// CompareAndSwap sets the 8-byte word at the start of r to new if it
// holds old. The future's Old is the value it held. r must be 8-byte
// aligned and at least 8 bytes long. Atomics are atomic only against
// other atomics on the same word.
func (c *Conn) CompareAndSwap(r RemoteRegion, old, new uint64) *Future {
	return c.atomic(verbs.OpCompareSwap, r, old, new)
}

// FetchAdd adds delta to the 8-byte word at the start of r; the future's
// Old is the value before.
func (c *Conn) FetchAdd(r RemoteRegion, delta uint64) *Future {
	return c.atomic(verbs.OpFetchAdd, r, delta, 0)
}

func (c *conn) atomic(opc verbs.Opcode, r RemoteRegion, cmpAdd, swap uint64) *Future {
	if err := c.refuseOnUC(opc); err != nil {
		return newResolved(err)
	}
	if err := c.eng.Lacks(verbs.FeatureAtomics); err != nil {
		return newResolved(fmt.Errorf("rdma: %v: %w", opc, err))
	}
	if r.Len < 8 || r.Addr%8 != 0 {
		return newResolved(fmt.Errorf("rdma: %v on %v: %w: needs an 8-byte aligned word", opc, r, ErrInvalid))
	}
	if c.rc.Life.Err() != nil {
		return newResolved(c.rc.Life.ClosedErr())
	}
	pb, err := c.eng.Pool.Get(8)
	if err != nil {
		return newResolved(fmt.Errorf("rdma: %v: %w", opc, err))
	}
	c.rc.Counters.Issued(opc, 8)
	return c.post(&rc.Op{Kind: rc.OpAtomic, Buf: pb, N: 8}, &verbs.SendWR{Opcode: opc, Flags: verbs.SendSignaled, RemoteAddr: r.Addr, RKey: r.RKey, CompareAdd: cmpAdd, Swap: swap})
}

// local resolves a Local into pool memory, refusing nil and released
// buffers and buffers of another pool.
func local(l Local) (*pool.Buffer, int, int, error) {
	if l == nil {
		return nil, 0, 0, fmt.Errorf("rdma: nil buffer: %w", ErrInvalid)
	}
	return l.span()
}

// post posts one signaled WR for o and returns its future. The buffer is
// referenced until the completion; atomics own theirs outright.
func (c *conn) post(o *rc.Op, wr *verbs.SendWR) *Future {
	if err := c.hold(o); err != nil {
		return newResolved(err)
	}
	f := newFuture(c.rc.Drv)
	o.Fut, o.Gen, o.Signaled = (*opFuture)(f), f.gen, true
	c.rc.SQ.Submit(wr, verbs.SGE{Addr: o.Buf.Addr() + uint64(o.Off), Length: uint32(o.N), LKey: o.Buf.LKey()}, o)
	return f
}

// hold checks that o's buffer belongs to this connection and references
// it for the operation.
func (c *conn) hold(o *rc.Op) error {
	if o.Kind == rc.OpAtomic {
		return nil
	}
	if o.Buf.Pool() != c.eng.Pool {
		return fmt.Errorf("rdma: %w: buffer from another connection's pool (allocate it with this connection's Alloc)", ErrInvalid)
	}
	if err := o.Buf.Ref(); err != nil {
		return fmt.Errorf("rdma: %w", err)
	}
	return nil
}

// PoolStats reports the buffer pool of the connection's engine, which
// every connection of the engine shares: slabs, registered bytes, buffers
// in use.
func (c *Conn) PoolStats() PoolStats { return PoolStats(c.eng.Pool.Stats()) }
