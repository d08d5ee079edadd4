package stream

import (
	"io"
	"time"

	"github.com/go-rdma/rdma"
)

// A stream whose connection fell back to TCP (rdma.WithTCPFallback,
// which Dial and Listen turn on: see streamOptions) carries its bytes
// over the connection's NetConn, the handshake's TCP connection (its
// TLS session with rdma.WithTLS): each method of Conn passes to it, in
// one branch, with nothing allocated and no goroutine of the stream's.
// Its errors are the socket's *net.OpError values.

// newTCPStream is the stream over c, which fell back to TCP.
func newTCPStream(c *rdma.Conn) *Conn {
	return &Conn{c: c, nc: c.NetConn(), laddr: c.LocalAddr(), raddr: c.RemoteAddr()}
}

// Transport is what carries the stream: rdma.RC, or rdma.TCP when its
// connection fell back to TCP because a side has no RDMA device
// (rdma.WithTCPFallback, on by default for a stream whose provider is
// "auto"; docs/stream.md).
func (s *Conn) Transport() rdma.Transport { return s.c.Transport() }

// closeTCP is Close of a stream over TCP: it closes the socket and
// lets the connection's engine go.
func (s *Conn) closeTCP() error {
	s.closeOnce.Do(func() {
		if err := s.c.Close(); err != nil {
			s.closeErr = s.opError("close", err)
		}
	})
	return s.closeErr
}

// readFromTCP is ReadFrom over TCP: the socket's own (sendfile, splice)
// where it has one.
func (s *Conn) readFromTCP(r io.Reader) (int64, error) {
	if rf, ok := s.nc.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{s.nc}, r)
}

// writeToTCP is WriteTo over TCP.
func (s *Conn) writeToTCP(w io.Writer) (int64, error) {
	if wt, ok := s.nc.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.Copy(w, struct{ io.Reader }{s.nc})
}

// closeWriteTCP is CloseWrite over TCP: the peer reads io.EOF.
func (s *Conn) closeWriteTCP() error {
	if cw, ok := s.nc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return s.opError("close", rdma.ErrNotSupported)
}

// setDeadlineTCP sets the socket's deadlines: read, write or both.
func (s *Conn) setDeadlineTCP(t time.Time, read, write bool) error {
	switch {
	case read && write:
		return s.nc.SetDeadline(t)
	case read:
		return s.nc.SetReadDeadline(t)
	}
	return s.nc.SetWriteDeadline(t)
}
