package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/go-rdma/rdma/internal/ud"
)

// PacketConn is a net.PacketConn over an unreliable datagram (UD) queue
// pair: WriteTo sends one datagram, ReadFrom takes one, as with UDP.
// Datagrams may be lost, reordered or dropped by a receiver that falls
// behind, and none is larger than MaxDatagram.
//
// Its address is an ip:port, the address of a UDP socket it binds beside
// its queue pair: a peer's side channel, which maps the ip:port to the
// UD queue pair number, Q_Key and GID behind it. WriteTo to an address it
// has not written to or heard from asks that socket first (bounded by the
// write deadline and a few retries); the answers are cached for up to
// 1024 peers. ReadFrom reports a sender by the ip:port it announced, so
// that a reply to that address reaches it.
//
// # Multicast
//
// JoinGroup makes the PacketConn a member of a multicast group: a
// datagram WriteTo sends to group:port reaches every member whose own
// port is port, as with UDP sockets joined to a group, and ReadFrom
// reports its sender's address as for unicast. Writing to a group needs
// no membership and asks no side channel. The datagram is one SEND to
// the group, which the device copies to each member queue pair; its
// destination port travels in the immediate data, and a member drops
// (and counts, PacketStats.DroppedMulticast) what is for another port.
// A member that sends to its own group reads its own datagram too: the
// device copies it to every member queue pair, the sender's included
// (soft and rxe do), as IP_MULTICAST_LOOP does by default; a sender that
// did not join gets none. A datagram to a group is checked against the
// sender's MaxDatagram only: keep it within every member's. On the soft
// provider a group reaches the PacketConns of this process only. Costs
// and limits: docs/connections.md.
//
// All methods are safe for concurrent use.
type PacketConn struct {
	ep        *ud.Endpoint
	eng       *engine
	local     *PacketAddr
	closeOnce sync.Once
	closeErr  error
}

var _ net.PacketConn = (*PacketConn)(nil)

// PacketAddr is the address of a PacketConn: an ip:port. ReadFrom
// reports senders with it; WriteTo takes it, or a *net.UDPAddr of the
// same ip:port. Network is "rdma" and String is ip:port. A sender that
// never announced its ip:port (see docs/connections.md) reads as its IP
// with port 0 and its QP number ("10.0.0.2:0#qp1a"); WriteTo still
// reaches it.
type PacketAddr struct {
	a *ud.Addr
}

// Network is "rdma".
func (a *PacketAddr) Network() string { return "rdma" }

// String is the address's ip:port.
func (a *PacketAddr) String() string {
	if a == nil || a.a == nil {
		return "<nil>"
	}
	return a.a.String()
}

// AddrPort is the address's ip:port.
func (a *PacketAddr) AddrPort() netip.AddrPort {
	if a == nil || a.a == nil {
		return netip.AddrPort{}
	}
	return a.a.AddrPort()
}

// ResolvePacketAddr parses address, an ip:port or host:port (looked up
// as net.ResolveUDPAddr does), into a PacketAddr for WriteTo. It does not
// ask the address's side channel: the first WriteTo does.
func ResolvePacketAddr(address string) (*PacketAddr, error) {
	ua, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return nil, err
	}
	return &PacketAddr{a: ud.NewAddr(ua.AddrPort())}, nil
}

// ListenPacket opens a PacketConn on address ("ip:port"; port 0 picks a
// free one) over network "rdma", on the device that serves the address
// (or the one WithProvider and WithDevice choose), sharing the engine of
// the package-level Dial and Listen. WithQueueDepth sets the datagrams in
// flight (default 128) and the receives posted (default 256). A device
// without UD queue pairs (iWARP) gives an error wrapping ErrNotSupported.
func ListenPacket(network, address string, opts ...Option) (*PacketConn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg := defaultConfig()
	if err := applyOptions(&cfg, opts); err != nil {
		return nil, err
	}
	return listenPacket(nil, cfg, address)
}

// ListenPacket opens a PacketConn on address over network "rdma", as the
// package-level ListenPacket does, on this engine.
func (x *Engine) ListenPacket(network, address string, opts ...ConnOption) (*PacketConn, error) {
	if network != "rdma" {
		return nil, &net.OpError{Op: "listen", Net: network, Err: fmt.Errorf("%w: network %q (want \"rdma\")", ErrInvalid, network)}
	}
	cfg, err := connConfig(x, opts)
	if err != nil {
		return nil, err
	}
	return listenPacket(x.e, cfg, address)
}

func listenPacket(eng *engine, cfg config, address string) (*PacketConn, error) {
	const network = "rdma"
	fail := func(err error) (*PacketConn, error) {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	switch {
	case cfg.cm:
		return fail(fmt.Errorf("%w: WithRDMACM: a PacketConn has no connections to set up", ErrInvalid))
	case cfg.handler != nil:
		return fail(fmt.Errorf("%w: WithRecvHandler: a PacketConn's datagrams are read with ReadFrom", ErrInvalid))
	case cfg.tls != nil:
		return fail(fmt.Errorf("%w: WithTLS: datagrams have no TLS (use QUIC over the PacketConn)", ErrInvalid))
	}
	ua, err := net.ResolveUDPAddr("udp", address)
	if err != nil {
		return fail(err)
	}
	ap := ua.AddrPort()
	local := ap.Addr().Unmap()
	if local.IsUnspecified() {
		local = netip.Addr{}
	}
	sd, rd := ud.DefaultSendDepth, ud.DefaultRecvDepth
	if cfg.depthSet {
		sd, rd = cfg.sqDepth, cfg.rqDepth
	}
	cfg.sqDepth, cfg.rqDepth = sd, rd // what engine.check checks
	if eng, err = engineFor(eng, cfg, local); err != nil {
		return fail(err)
	}
	ep, err := ud.Listen(eng.Engine, ap, ud.Config{SendDepth: sd, RecvDepth: rd,
		Wrap: func(a *ud.Addr) net.Addr { return &PacketAddr{a: a} }})
	if err != nil {
		eng.Release()
		return fail(fmt.Errorf("rdma: %w", err))
	}
	return &PacketConn{ep: ep, eng: eng, local: &PacketAddr{a: ep.LocalAddr()}}, nil
}

// opError wraps err, an error of op on p, as the net package does.
func (p *PacketConn) opError(op string, addr net.Addr, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: p.local, Addr: addr, Err: err}
}

// ReadFrom reads the next datagram into b and reports its sender, as
// net.PacketConn's does: a datagram longer than b is cut to fit, and the
// rest is lost. It waits for a datagram, the read deadline or Close.
func (p *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, a, err := p.ep.ReadFrom(b)
	if err != nil {
		return 0, nil, p.opError("read", nil, err)
	}
	if ext := a.Ext(); ext != nil {
		return n, ext, nil
	}
	return n, &PacketAddr{a: a}, nil
}

// WriteTo sends b as one datagram to addr, a *PacketAddr or a
// *net.UDPAddr. It returns once b is copied and posted; as with UDP,
// nothing tells whether it arrived. To a multicast group:port it sends
// one datagram to the group's members on that port (see Multicast). A datagram larger than MaxDatagram
// (or the peer's) fails with an error wrapping ErrInvalid that names the
// MTU.
func (p *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	a, err := packetAddr(addr)
	if err != nil {
		return 0, p.opError("write", addr, err)
	}
	n, err := p.ep.WriteTo(b, a)
	if err != nil {
		return n, p.opError("write", addr, err)
	}
	return n, nil
}

// Alloc returns n bytes of registered memory, zero to its capacity,
// from the pool of the PacketConn's engine, for SendTo.
func (p *PacketConn) Alloc(n int) (*Buffer, error) {
	if p.ep.Closed() {
		return nil, p.opError("alloc", nil, ErrClosed)
	}
	return p.eng.alloc(n)
}

// SendTo sends src (a Buffer of the PacketConn's engine, or a Slice of
// one) as one datagram to addr without copying it, as Conn.Send does:
// src must not change until the Future resolves, which it does once the
// datagram has left (as with UDP, nothing says it arrived). Finding a new
// peer's route and waiting for room in the send queue happen before
// SendTo returns, bounded by the write deadline; a failure there, and a
// datagram over the MTU, resolve the Future with the error at once.
func (p *PacketConn) SendTo(src Local, addr net.Addr) *Future {
	pb, off, n, err := local(src)
	if err != nil {
		return newResolved(p.opError("write", addr, err))
	}
	a, err := packetAddr(addr)
	if err != nil {
		return newResolved(p.opError("write", addr, err))
	}
	f := newFuture(p.ep.Driver())
	if err := p.ep.SendBuffer(pb, off, n, a, (*sendToFuture)(f)); err != nil {
		f.resolve(p.opError("write", addr, err), 0, 0, false, nil, 0)
	}
	runtime.KeepAlive(src) // the handle's cleanup must not run before the post took its reference
	return f
}

// sendToFuture is a Future as the datagram endpoint sees it (ud.SendDone).
type sendToFuture Future

// SendDone resolves SendTo's Future.
func (f *sendToFuture) SendDone(err error, n int) { (*Future)(f).resolve(err, n, 0, false, nil, 0) }

// PacketBatch collects datagrams to send without copies and posts them
// in one call: one chain of work requests, one doorbell. It is reusable:
// Post empties it. It is not safe for concurrent use.
type PacketBatch struct {
	p    *PacketConn
	ds   []ud.Datagram
	srcs []Local // kept reachable until Post: their handles own the memory
	err  error
}

// NewBatch returns an empty batch for p.
func (p *PacketConn) NewBatch() *PacketBatch { return &PacketBatch{p: p} }

// Len is the number of datagrams in the batch.
func (b *PacketBatch) Len() int { return len(b.ds) }

// SendTo adds a datagram of src (a Buffer of the PacketConn's engine, or
// a Slice of one) to addr. An invalid one makes Post fail.
func (b *PacketBatch) SendTo(src Local, addr net.Addr) {
	if b.err != nil {
		return
	}
	pb, off, n, err := local(src)
	if err == nil {
		var a *ud.Addr
		if a, err = packetAddr(addr); err == nil {
			b.ds = append(b.ds, ud.Datagram{Buf: pb, Off: off, N: n, To: a})
			b.srcs = append(b.srcs, src)
			return
		}
	}
	b.err = b.p.opError("write", addr, fmt.Errorf("datagram %d: %w", len(b.ds), err))
}

// Post sends the batch's datagrams, as SendTo would one by one, and
// empties the batch. Its Future resolves once the last has left, with the
// first error and the bytes sent (Len); src must not change until then.
// A batch holds at most the send depth (WithQueueDepth); finding new
// peers and waiting for room happen before Post returns, bounded by the
// write deadline, and a failure there sends none.
func (b *PacketBatch) Post() *Future {
	defer b.reset()
	if b.err != nil {
		return newResolved(b.err)
	}
	f := newFuture(b.p.ep.Driver())
	if err := b.p.ep.SendBatch(b.ds, (*sendToFuture)(f)); err != nil {
		f.resolve(b.p.opError("write", nil, err), 0, 0, false, nil, 0)
	}
	runtime.KeepAlive(b.srcs) // the posts took their references
	return f
}

func (b *PacketBatch) reset() {
	clear(b.ds)
	clear(b.srcs)
	b.ds, b.srcs, b.err = b.ds[:0], b.srcs[:0], nil
}

// RecvFrom takes the next datagram without a copy: its payload in a
// Buffer of the engine's pool, which the caller must Release, and its
// sender, as ReadFrom reports it. It waits for a datagram, the read
// deadline, Close, or the end of ctx.
func (p *PacketConn) RecvFrom(ctx context.Context) (*Buffer, net.Addr, error) {
	pb, a, err := p.ep.Take(ctx)
	if err != nil {
		return nil, nil, p.opError("read", nil, err)
	}
	if ext := a.Ext(); ext != nil {
		return newBuffer(pb), ext, nil
	}
	return newBuffer(pb), &PacketAddr{a: a}, nil
}

// packetAddr is the datagram endpoint's address for addr, a *PacketAddr
// or a *net.UDPAddr.
func packetAddr(addr net.Addr) (*ud.Addr, error) {
	switch t := addr.(type) {
	case *PacketAddr:
		if t != nil && t.a != nil {
			return t.a, nil
		}
	case *net.UDPAddr:
		if t != nil {
			return ud.NewAddr(t.AddrPort()), nil
		}
	}
	return nil, fmt.Errorf("%w: address %v of type %T (want *rdma.PacketAddr or *net.UDPAddr)", ErrInvalid, addr, addr)
}

// JoinGroup makes p a member of the multicast group group, an IPv4 or
// IPv6 multicast address of the IP version of p's own address: from
// now on datagrams sent to group:port, port p's own, reach ReadFrom.
// An IPv4 group is the GID ::ffff:a.b.c.d (RoCE v2 over IPv4), an IPv6
// group its own address. It takes a netip.Addr, not a net.Addr: a group
// is an IP address without a port (the port is p's), and the interface
// is p's device, so there is nothing else to name.
//
// Joining a group joined already, an address that is not multicast, or
// more groups than p may join (64, or the device's max_mcast_grp if
// smaller) fails with an error wrapping ErrInvalid; a device without
// multicast with one wrapping ErrNotSupported that names the feature.
// Close leaves every group.
func (p *PacketConn) JoinGroup(group netip.Addr) error {
	if err := p.ep.Join(group); err != nil {
		return p.opError("join", groupAddr(group), err)
	}
	return nil
}

// LeaveGroup ends p's membership of group: datagrams to it stop
// arriving, and those that arrive after (sent before) are dropped, while
// those received before stay to be read. Leaving a group not joined
// fails with an error wrapping ErrInvalid.
func (p *PacketConn) LeaveGroup(group netip.Addr) error {
	if err := p.ep.Leave(group); err != nil {
		return p.opError("leave", groupAddr(group), err)
	}
	return nil
}

// groupAddr is group as an OpError's address.
func groupAddr(group netip.Addr) net.Addr {
	return &net.IPAddr{IP: group.AsSlice(), Zone: group.Zone()}
}

// Close closes the PacketConn: blocked and later ReadFrom and WriteTo
// calls fail with an error wrapping net.ErrClosed. It waits for the
// datagrams in flight to leave, and gives the receive buffers back to the
// engine's pool. Close is idempotent.
func (p *PacketConn) Close() error {
	p.closeOnce.Do(func() {
		err := p.ep.Close()
		p.closeErr = errors.Join(err, p.eng.Release())
		if p.closeErr != nil {
			p.closeErr = p.opError("close", nil, p.closeErr)
		}
	})
	return p.closeErr
}

// LocalAddr is the PacketConn's address (a *PacketAddr).
func (p *PacketConn) LocalAddr() net.Addr { return p.local }

// SetDeadline sets the read and write deadlines.
func (p *PacketConn) SetDeadline(t time.Time) error {
	p.ep.SetReadDeadline(t)
	p.ep.SetWriteDeadline(t)
	return nil
}

// SetReadDeadline sets the deadline of ReadFrom calls, pending ones
// included; the zero time clears it. A ReadFrom past it fails with an
// error wrapping os.ErrDeadlineExceeded whose Timeout() is true.
func (p *PacketConn) SetReadDeadline(t time.Time) error {
	p.ep.SetReadDeadline(t)
	return nil
}

// SetWriteDeadline sets the deadline of WriteTo calls, pending ones
// included: a WriteTo waits for room in the send queue and for the
// answer of a new peer's side channel.
func (p *PacketConn) SetWriteDeadline(t time.Time) error {
	p.ep.SetWriteDeadline(t)
	return nil
}

// MaxDatagram is the largest datagram the PacketConn sends and receives:
// its port's path MTU (1024 to 4096 bytes; a UD datagram is one packet).
// A peer on a port of a smaller MTU takes only as much as its own.
func (p *PacketConn) MaxDatagram() int { return p.ep.MaxDatagram() }

// Provider is "verbs" or "soft".
func (p *PacketConn) Provider() string { return p.eng.Prov.Name() }

// Device is the name of the device the PacketConn uses.
func (p *PacketConn) Device() string { return p.eng.Name() }

// PacketStats are a PacketConn's counters.
type PacketStats struct {
	Sent     uint64 // datagrams posted
	Received uint64 // datagrams received, including those dropped below
	// DroppedQueueFull counts datagrams that arrived while as many as
	// the receive depth already waited for ReadFrom.
	DroppedQueueFull uint64
	// DroppedBadHeader counts receives whose GRH did not parse.
	DroppedBadHeader uint64
	// DroppedMulticast counts datagrams to a multicast group that were
	// not for this PacketConn: to another port of a group it joined,
	// without the port (not sent by a PacketConn), or to a group it has
	// left (in flight when it left).
	DroppedMulticast uint64
	// NotReposted counts receives that could not be posted again at
	// once (the pool at its limit): until a ReadFrom posts them, fewer
	// receives are posted, and datagrams that find none are dropped by
	// the device, uncounted (UD's rule: the sender is not told).
	NotReposted uint64
	// RecvErrors counts receives that completed with an error other
	// than a flush.
	RecvErrors uint64
	// Resolved and ResolveFailed count addresses asked of their side
	// channel, answered and not.
	Resolved      uint64
	ResolveFailed uint64
	// Answered counts side-channel requests answered; Ignored the
	// side-channel messages that were malformed, unsolicited, or past
	// the answer rate (1000 a second).
	Answered uint64
	Ignored  uint64
	// Peers is the number of peers cached; Evicted how many left the
	// cache for its bound (1024).
	Peers   int
	Evicted uint64
}

// PacketStats reads the PacketConn's counters.
func (p *PacketConn) PacketStats() PacketStats { return PacketStats(p.ep.Stats()) }
