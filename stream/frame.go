package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The stream protocol runs on top of a Conn's SENDs. Every message is a
// SEND with an immediate value; the immediate value is the whole header:
//
//	bits 31..28  kind: hello, data, credit or fin
//	bits 27..0   credits: messages of ours the peer has consumed since it
//	             last said so (piggybacked on any kind but hello)
//
// The payload of a data message is stream bytes, nothing else; credit and
// fin messages are empty; the hello carries streamHelloSize bytes (magic
// and version). Each side sends its hello first, so a peer that speaks
// the async API but not the stream is caught at its first message.
//
// Flow control counts messages. The receiver's Conn keeps its
// RecvWindow of messages coming without a credit wait (rdma.Conn
// documents it; the peer learns it as SendWindow); a sender may have at
// most window = SendWindow - streamReserve data messages that the
// receiving application has not consumed. The reserve covers what is not
// data: the hello, the fin, and the credit-only messages still unread, of
// which there are at most four because each carries at least
// ceil(window/4) credits and the credits in flight never exceed the
// window. So the sender never waits in the credit layer, and no message
// needs a round trip of its own.
const (
	frameHello  = 1
	frameData   = 2
	frameCredit = 3
	frameFin    = 4

	immKindShift  = 28
	immCreditMask = 1<<immKindShift - 1

	// streamReserve is how many of the peer's posted receives are kept
	// for messages that are not data (see above): the hello, the fin
	// and four credit messages.
	streamReserve = 6

	streamMagic     = "GRDMA-ST"
	streamVersion   = 1
	streamHelloSize = 16 // magic, version u16, flags u16, reserved u32
)

// ErrProtocol means the peer broke the stream protocol: it is not a
// go-rdma stream, or it is broken.
var ErrProtocol = errors.New("stream protocol error")

func streamImm(kind uint8, credits int) uint32 {
	return uint32(kind)<<immKindShift | uint32(credits)&immCreditMask
}

func streamHello() []byte {
	b := make([]byte, streamHelloSize)
	copy(b, streamMagic)
	binary.BigEndian.PutUint16(b[8:], streamVersion)
	return b
}

// streamState is the protocol state of one stream, without any I/O: what
// the fuzzer drives, and what the connection consults for every message.
type streamState struct {
	// Receive side.
	grant   int  // data messages the peer may have unconsumed (our window to it)
	unacked int  // data messages received and not yet credited back
	pending int  // of those, consumed by the application: credits to return
	hello   bool // the peer's hello arrived
	fin     bool // the peer's fin arrived

	// Send side.
	window      int // data messages we may have uncredited
	outstanding int // data messages sent and not yet credited
}

func newStreamState(grant, window int) streamState {
	return streamState{grant: grant, window: window}
}

// credits is how many more data messages may be sent now.
func (st *streamState) credits() int { return st.window - st.outstanding }

// sent records k data messages sent.
func (st *streamState) sent(k int) { st.outstanding += k }

// unsent gives back credits taken by sent for messages that were not
// posted after all.
func (st *streamState) unsent(k int) { st.outstanding -= k }

// consumed records k data messages the application has read in full.
func (st *streamState) consumed(k int) { st.pending += k }

// take returns the credits to send to the peer now, and forgets them.
func (st *streamState) take() int {
	k := st.pending
	st.pending = 0
	st.unacked -= k
	return k
}

// creditBatch is how many credits are worth a message of their own:
// a quarter of the window, rounded up, so that at most four such messages are ever
// unread by the peer.
func creditBatch(grant int) int { return (grant + 3) / 4 }

// onMessage checks one received message against the protocol and
// applies its credits. It returns the message's kind; any error is a
// protocol error and the stream is dead.
func (st *streamState) onMessage(imm uint32, hasImm bool, payload []byte) (uint8, error) {
	if !hasImm {
		return 0, fmt.Errorf("%w: message of %d bytes without a stream header", ErrProtocol, len(payload))
	}
	kind := uint8(imm >> immKindShift)
	credits := int(imm & immCreditMask)
	if !st.hello {
		if kind != frameHello {
			return 0, fmt.Errorf("%w: first message is not a stream hello (kind %d); the peer is not a go-rdma stream", ErrProtocol, kind)
		}
		if len(payload) != streamHelloSize || string(payload[:8]) != streamMagic {
			return 0, fmt.Errorf("%w: bad stream hello (%d bytes); the peer is not a go-rdma stream", ErrProtocol, len(payload))
		}
		if v := binary.BigEndian.Uint16(payload[8:]); v != streamVersion {
			return 0, fmt.Errorf("%w: peer speaks stream version %d, ours %d", ErrProtocol, v, streamVersion)
		}
		if credits != 0 {
			return 0, fmt.Errorf("%w: hello with credits", ErrProtocol)
		}
		st.hello = true
		return kind, nil
	}
	if credits > st.outstanding {
		return 0, fmt.Errorf("%w: peer returned %d credits, %d outstanding", ErrProtocol, credits, st.outstanding)
	}
	switch kind {
	case frameData:
		if st.fin {
			return 0, fmt.Errorf("%w: data after fin", ErrProtocol)
		}
		if len(payload) == 0 {
			return 0, fmt.Errorf("%w: empty data message", ErrProtocol)
		}
		if st.unacked >= st.grant {
			return 0, fmt.Errorf("%w: peer overran its window of %d messages", ErrProtocol, st.grant)
		}
		st.unacked++
	case frameCredit:
		if len(payload) != 0 || credits == 0 {
			return 0, fmt.Errorf("%w: malformed credit message (%d bytes, %d credits)", ErrProtocol, len(payload), credits)
		}
	case frameFin:
		if st.fin || len(payload) != 0 {
			return 0, fmt.Errorf("%w: malformed or repeated fin", ErrProtocol)
		}
		st.fin = true
	case frameHello:
		return 0, fmt.Errorf("%w: second hello", ErrProtocol)
	default:
		return 0, fmt.Errorf("%w: unknown message kind %d", ErrProtocol, kind)
	}
	st.outstanding -= credits
	return kind, nil
}
