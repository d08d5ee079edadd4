package rdma

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/rc"
)

// A protocol built on the async API (the stream package is one) names
// itself in the hello, as TLS's ALPN does, so that a dialer and a
// listener that speak different protocols on their connections, or
// different versions of one, are told apart at the dial instead of by
// garbled data later. The listener refuses a dialer whose protocol is not
// its own (ErrRefused, naming both); the dialer checks the listener's
// answer the same way. The plain async API names no protocol.

// WithProtocol names the application protocol spoken on the
// connections: a dialer and a listener must name the same one (or none),
// or the dial fails with an error matching ErrRefused that names both.
// Include the protocol's version in name ("myproto/2") so that peers of
// different versions are refused too. name is 1 to 32 bytes of printable
// ASCII. With WithRDMACM, the name travels in the private data of
// rdma_cm's connect request and accept, as the rest of the hello does
// not.
func WithProtocol(name string) ConnOption {
	return connOpt(func(c *config) error {
		if len(name) == 0 || len(name) > rc.MaxProtocol {
			return fmt.Errorf("rdma: %w: protocol name of %d bytes (want 1..%d)", ErrInvalid, len(name), rc.MaxProtocol)
		}
		for i := 0; i < len(name); i++ {
			if name[i] < 0x21 || name[i] > 0x7e {
				return fmt.Errorf("rdma: %w: protocol name %q (want printable ASCII, no spaces)", ErrInvalid, name)
			}
		}
		c.protocol = name
		return nil
	})
}
