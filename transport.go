package rdma

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Transport is the transport service of a connection's queue pair.
// Datagrams (UD) are a PacketConn's (ListenPacket), not a Conn's.
type Transport uint8

const (
	// RC, reliable connected, the default: every message and WRITE
	// arrives, in order, or the connection fails; READ and atomics
	// work; a sender waits for the peer's receives (credits).
	RC Transport = iota
	// UC, unreliable connected: SEND and WRITE (with or without
	// immediate data) only, with no acknowledgement. A message or WRITE
	// lost on the way, or a message that finds no receive posted at the
	// peer, is dropped there, and the sender's Future succeeds all the
	// same: it resolves once the device has sent it. There are no
	// credits (Credited is false): a protocol keeps at most SendWindow
	// messages unread by the peer's Recv, or messages past it are
	// dropped. READ, CompareAndSwap and FetchAdd fail at the call with
	// ErrNotSupported. The control channel (regions, close, the peer's
	// end) stays reliable: it is TCP. Close does not wait for messages
	// sent to arrive. Both ends must use UC (WithTransport); iWARP has
	// no UC, and rdma_cm connections (WithRDMACM) are RC.
	UC
	// TCP is the transport of a connection that fell back to TCP
	// (WithTCPFallback): no queue pair, its bytes go over NetConn, and
	// its RDMA operations (Send, Recv, Write, Read, atomics, Expose and
	// the region calls) fail at the call with ErrNotSupported. Done and
	// Err follow its Close and Abort only: the peer's end shows on
	// NetConn (io.EOF, a reset). It is no engine's connection: Stats
	// are zero, and the engine's stats do not count it; it holds a
	// reference to the engine it was set up on (soft), which Provider,
	// Device, Alloc and PoolStats name, until Close. WithTransport does
	// not take it.
	TCP
)

// String is "RC", "UC" or "TCP".
func (t Transport) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case TCP:
		return "TCP"
	}
	return fmt.Sprintf("Transport(%d)", uint8(t))
}

// WithTransport chooses the transport of the connections Dial makes and
// a Listener accepts: RC (the default) or UC. A dialer and a listener of
// different transports fail the dial with an error matching ErrRefused
// that names both.
func WithTransport(t Transport) ConnOption {
	return connOpt(func(c *config) error {
		if t != RC && t != UC {
			return fmt.Errorf("rdma: %w: transport %v (want RC or UC; datagrams are ListenPacket's)", ErrInvalid, t)
		}
		c.transport = t
		return nil
	})
}

// Transport is the connection's transport (WithTransport).
func (c *Conn) Transport() Transport { return c.cfg.transport }

// Transport is the transport of the connections the listener accepts
// (WithTransport).
func (l *Listener) Transport() Transport { return l.cfg.transport }

// checkTransport refuses a transport the device or the other options
// cannot serve, at Dial or Listen.
func (e *engine) checkTransport(cfg config) error {
	if cfg.transport != UC {
		return nil
	}
	if cfg.cm {
		return fmt.Errorf("rdma: %w: WithTransport(UC) with WithRDMACM: rdma_cm connections are RC", ErrNotSupported)
	}
	if err := e.Lacks(verbs.FeatureUC); err != nil {
		return fmt.Errorf("rdma: WithTransport(UC): %w", err)
	}
	return nil
}

// refuseOnUC fails what UC cannot carry (READ and atomics) at the call,
// naming the transport, and every operation of a connection that fell
// back to TCP.
func (c *conn) refuseOnUC(opc verbs.Opcode) error {
	if c.tcp != nil { // the opcode's name only when it is needed
		return c.refuseOnTCP(opc.String())
	}
	if c.cfg.transport == UC && !opc.Supports(verbs.UC) {
		return fmt.Errorf("rdma: %v: %w on a UC connection: UC carries SEND and WRITE only (WithTransport)", opc, ErrNotSupported)
	}
	return nil
}
