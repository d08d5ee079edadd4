package rdma

import (
	"bytes"
	"fmt"
	"strconv"
)

// A protocol built on the async API (the stream package is one) names
// itself in the hello, as TLS's ALPN does, so that a dialer and a
// listener that speak different protocols on their connections, or
// different versions of one, are told apart at the dial instead of by
// garbled data later. The listener refuses a dialer whose protocol is not
// its own (ErrRefused, naming both); the dialer checks the listener's
// answer the same way. The plain async API names no protocol.

// maxProtocol is the longest protocol name the hello carries.
const maxProtocol = 32

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
		if len(name) == 0 || len(name) > maxProtocol {
			return fmt.Errorf("rdma: %w: protocol name of %d bytes (want 1..%d)", ErrInvalid, len(name), maxProtocol)
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

// sameProtocol refuses a peer whose hello names another protocol than
// ours; dialing says which side this is, for the error's words.
func sameProtocol(ours string, peer *hello, dialing bool) error {
	return matchProtocol(ours, protocolName(peer.Protocol[:]), dialing)
}

// protocolName is the name in a NUL-padded protocol field.
func protocolName(field []byte) string {
	if i := bytes.IndexByte(field, 0); i >= 0 {
		field = field[:i]
	}
	return string(field)
}

// matchProtocol refuses a peer that speaks theirs when we speak ours.
func matchProtocol(ours, theirs string, dialing bool) error {
	if theirs == ours {
		return nil
	}
	if dialing {
		return fmt.Errorf("rdma: %w: this dialer speaks %s, the listener %s", ErrRefused, describeProtocol(ours), describeProtocol(theirs))
	}
	return fmt.Errorf("rdma: %w: the dialer speaks %s, this listener %s", ErrRefused, describeProtocol(theirs), describeProtocol(ours))
}

func describeProtocol(name string) string {
	if name == "" {
		return "the plain async API (no protocol)"
	}
	return "protocol " + strconv.Quote(name)
}
