package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/rc"
)

// A connection set up through rdma_cm has no control channel, so its
// hello travels in the private data of rdma_cm's connect request (the
// dialer's) and of its accept (the listener's): the handshake version,
// the largest message the sender takes, the application protocol
// (WithProtocol) and the sender's RecvWindow. A listener refuses a dialer of another version or
// protocol with a reject whose private data says why; the dialer turns it
// into ErrRefused. Private data that does not start with cmHelloMagic
// (all zeros from an rdma_cm peer that sent none, such as v0.1.0) is a
// peer of the plain async API with our settings, as before the hello.
//
//	magic "GR" | version u8 | flags u8 | max message u32 BE | protocol, NUL-padded to maxProtocol | receive window u32 BE
//	[flags & cmFlagSettle: settle byte's address u64 BE | its rkey u32 BE]
//
// flags: cmFlagSettle (a listener's), cmFlagGoFirst (a dialer's).
//
// A hello of before v0.2.0 ends at the protocol: its window reads as 0
// (private data is padded with zeros), which SendWindow reports as not
// said. A listener on iWARP adds the byte its dialer READs to settle the
// connection (settleIWARP); only an accept carries it.
const cmHelloSize = 8 + rc.MaxProtocol + 4

// Flags of a hello.
const (
	// cmFlagSettle: the hello ends with the address and rkey of a byte
	// the dialer may READ (settleIWARP). Only a listener's carries it.
	cmFlagSettle = 1
	// cmFlagGoFirst: the dialer, on iWARP, sends a zero-length SEND
	// before anything else when the listener is go-rdma's, and the
	// listener's sends wait for it (awaitGo). Only a dialer's carries it.
	cmFlagGoFirst = 2
)

// cmSettleSize is the size of the settle byte's address and rkey.
const cmSettleSize = 12

// An accept's hello with the settle byte must fit an accept's private
// data.
var _ [ibv.CMMaxAcceptData - cmHelloSize - cmSettleSize]struct{}

var cmHelloMagic = [2]byte{'G', 'R'}

// cmRejectPrefix starts the reject private data of a go-rdma listener.
const cmRejectPrefix = "go-rdma: "

// A hello must fit the smallest private data rdma_cm carries: a connect
// request's on InfiniBand and RoCE.
var _ [ibv.CMMaxConnectData - cmHelloSize]struct{}

type cmHello struct {
	maxMsg     uint32
	protocol   string
	recvWindow uint32
	settle     RemoteRegion // a listener's byte to READ (settleIWARP); Len 0: none
	goFirst    bool         // a dialer's: it sends a go before anything else (cmFlagGoFirst)
}

// cmHelloFor is the hello of a connection of cfg: rdma_cm connections
// keep their own receive queue of cfg.rqDepth receives.
func cmHelloFor(cfg config) cmHello {
	return cmHello{maxMsg: uint32(cfg.maxMsg), protocol: cfg.protocol, recvWindow: uint32(rc.RecvWindowFor(cfg.rqDepth, cfg.rqDepth))}
}

func (h cmHello) marshal() []byte {
	n := cmHelloSize
	if h.settle.Len > 0 {
		n += cmSettleSize
	}
	b := make([]byte, n)
	copy(b, cmHelloMagic[:])
	b[2] = rc.Version
	binary.BigEndian.PutUint32(b[4:8], h.maxMsg)
	copy(b[8:], h.protocol)
	binary.BigEndian.PutUint32(b[8+rc.MaxProtocol:], h.recvWindow)
	if h.goFirst {
		b[3] |= cmFlagGoFirst
	}
	if h.settle.Len > 0 {
		b[3] |= cmFlagSettle
		binary.BigEndian.PutUint64(b[cmHelloSize:], h.settle.Addr)
		binary.BigEndian.PutUint32(b[cmHelloSize+8:], h.settle.RKey)
	}
	return b
}

// errNoCMHello: the peer's private data holds no go-rdma hello.
var errNoCMHello = errors.New("no go-rdma hello in the rdma_cm private data")

// parseCMHello reads a peer's hello from rdma_cm private data (padded
// with zeros to the transport's size).
func parseCMHello(b []byte) (cmHello, error) {
	if len(b) < 8+rc.MaxProtocol || !bytes.Equal(b[:2], cmHelloMagic[:]) {
		return cmHello{}, errNoCMHello
	}
	if b[2] != rc.Version {
		return cmHello{}, fmt.Errorf("%w: peer version %d, ours %d", ErrVersion, b[2], rc.Version)
	}
	h := cmHello{maxMsg: binary.BigEndian.Uint32(b[4:8]), protocol: rc.ProtocolName(b[8 : 8+rc.MaxProtocol])}
	if len(b) >= cmHelloSize {
		h.recvWindow = binary.BigEndian.Uint32(b[8+rc.MaxProtocol:])
	}
	if b[3]&cmFlagSettle != 0 && len(b) >= cmHelloSize+cmSettleSize {
		h.settle = RemoteRegion{Addr: binary.BigEndian.Uint64(b[cmHelloSize:]), RKey: binary.BigEndian.Uint32(b[cmHelloSize+8:]), Len: 1}
	}
	h.goFirst = b[3]&cmFlagGoFirst != 0
	if h.maxMsg == 0 {
		return cmHello{}, fmt.Errorf("rdma: %w: rdma_cm hello with a largest message of 0", ErrInvalid)
	}
	for i := 0; i < len(h.protocol); i++ {
		if h.protocol[i] < 0x21 || h.protocol[i] > 0x7e {
			return cmHello{}, fmt.Errorf("rdma: %w: rdma_cm hello with protocol %q", ErrInvalid, h.protocol)
		}
	}
	return h, nil
}

// learnCMHello checks the peer's hello against cfg and returns it. A
// peer without a hello speaks the plain async API with our settings and
// does not say its receive window.
func learnCMHello(cfg config, priv []byte, dialing bool) (cmHello, error) {
	h, err := parseCMHello(priv)
	if errors.Is(err, errNoCMHello) {
		return cmHello{maxMsg: uint32(cfg.maxMsg)}, rc.MatchProtocol(cfg.protocol, "", dialing)
	}
	if err != nil {
		return cmHello{}, err
	}
	return h, rc.MatchProtocol(cfg.protocol, h.protocol, dialing)
}

// cmRefused is the dialer's error for a listener's reject that says why.
func cmRefused(err error) error {
	var ce *ibv.CMEventError
	if errors.As(err, &ce) && bytes.HasPrefix(ce.PrivateData, []byte(cmRejectPrefix)) {
		why := ce.PrivateData[len(cmRejectPrefix):]
		if i := bytes.IndexByte(why, 0); i >= 0 {
			why = why[:i]
		}
		return fmt.Errorf("rdma: %w: the listener says: %q", ErrRefused, why)
	}
	return err
}

// cmRejectData is a reject's private data saying why, cut to what a
// reject carries.
func cmRejectData(why error) []byte {
	text := strings.TrimPrefix(why.Error(), "rdma: "+ErrRefused.Error()+": ")
	b := []byte(cmRejectPrefix + text)
	return b[:min(len(b), ibv.CMMaxRejectData)]
}
