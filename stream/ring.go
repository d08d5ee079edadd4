package stream

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/go-rdma/rdma"
)

// Protocol v2: bytes in a ring (the shape of rsockets and SMC-R).
//
// Each side exposes a receive ring, registered memory that the peer may
// write and nothing else (rdma.Conn.Expose with RemoteWrite), and tells
// the peer where it is in its hello. A writer copies the bytes of Write
// into a staging ring of its own, as large as the peer's ring up to
// maxStaging, and places them at the peer ring's tail with RDMA
// WRITE_WITH_IMM. Staging holds bytes only until their WRITE completes,
// the peer's ring until the peer reads them, so staging can be the
// smaller of the two. A WRITE never crosses the end of either ring: one
// that would is posted as two.
//
// Every message carries a 32-bit immediate value, the whole header:
//
//	bits 31..29  op: hello, data, credit or fin
//	bits 28..0   credits: how many bytes of the peer's the sender has
//	             read, in all, modulo 2^29
//
// A data message is a WRITE_WITH_IMM; its length is the number of bytes
// written (the completion reports it), at the offset where the previous
// data message ended. The other three are SENDs: the hello carries
// helloSize bytes (magic, version, the ring), credit and fin none.
//
// Credits are cumulative counts of bytes consumed, so a lost or late
// one is made good by the next: every message, data or not, carries
// them. A reader that has nothing to write returns them on their own
// once a quarter of its ring has been read since it last did. A writer
// may have at most the peer's ring size written and not yet credited.
//
// What a receiver can check is what the messages announce: a peer that
// announces more data than the ring has room for, data that crosses the
// ring's end, empty data, or credits for bytes it was never sent breaks
// the protocol, and its connection is aborted. What it cannot check is
// where a WRITE put its bytes: a completion carries no address. The
// peer holds write rights to the whole ring for the stream's life, so
// it can write any byte of the ring at any time, unread bytes included;
// that garbles only the bytes it sends us, its own stream, and it can
// never reach memory outside the ring.
//
// Header mode. Connections set up through rdma_cm have no credits of
// the library's (rdma.Conn.Credited), so nothing there stops a message
// from finding the peer's receive queue empty, which iWARP punishes by
// ending the connection; and iWARP has no immediate data. There the
// header travels in the payload of a SEND instead, hdrSize bytes:
//
//	imm u32      the header above: op and credits
//	length u32   a data message's length
//	took u32     how many of the peer's messages the sender has taken,
//	             in all, modulo 2^32
//
// A data message is a WRITE of its bytes followed by that SEND (RC
// places the WRITE before the SEND completes at the peer). The counts
// of messages taken bound what is in flight, against the peer's receive
// window (rdma.Conn.SendWindow). A writer stages bytes only while the
// messages that will carry them, with those of the bytes staged and not
// yet posted, fit in half the window less the messages untaken: so data
// never fills more than half, and credits can always go out to reopen a
// window that data filled; and bytes a Write took never wait for the
// peer's application to take messages, so Close can send them and the
// fin whether the peer reads or not. Data goes while fewer than all but
// one of the window are untaken, a fin or credits while fewer than all.
// A side that has taken a quarter of its own window since it last said
// so sends its count on its own.
const (
	opHello  = 1
	opData   = 2
	opCredit = 3
	opFin    = 4

	immOpShift = 29
	creditMask = 1<<immOpShift - 1

	streamMagic   = "GRDMA-ST"
	streamVersion = 2
	helloSize     = 32 // magic, version u16, flags u16, reserved u32, ring addr u64, len u32, rkey u32
	hdrSize       = 12 // header mode's header: imm u32, length u32, took u32

	// DefaultRingSize is the receive ring each side of a stream exposes
	// unless Dialer.RingSize or ListenConfig.RingSize say otherwise. It
	// bounds the bytes in flight. A side holds its ring and a staging
	// ring of min(peer's ring, 1 MiB): 3 MiB by default. Smaller rings
	// save memory and cost throughput: 1 MiB runs one connection in one
	// process on soft about 20 % slower, 256 KiB 64 KiB Writes between
	// two processes at half (docs/history/stream.md).
	DefaultRingSize = 2 << 20
	// MinRingSize and MaxRingSize bound a ring, ours or the peer's.
	MinRingSize = 4 << 10
	MaxRingSize = 64 << 20

	// maxStaging bounds a writer's staging ring: it needs to hold the
	// bytes whose WRITEs have not completed, not all that the peer has
	// not read.
	maxStaging = 1 << 20

	// maxCork is the most bytes gathered behind a WRITE in flight
	// before they go out without waiting for it (SMC-R's autocork
	// limit; min(maxCork, ring/2) for small rings).
	maxCork = 64 << 10
)

// ErrProtocol means the peer broke the stream protocol: it is not a
// go-rdma stream, or it is broken.
var ErrProtocol = errors.New("stream protocol error")

func streamImm(op uint8, credits uint64) uint32 {
	return uint32(op)<<immOpShift | uint32(credits)&creditMask
}

// marshalHello is our hello: the protocol's magic and version, and the
// ring the peer may write.
func marshalHello(b []byte, ring rdma.RemoteRegion) {
	copy(b, streamMagic)
	binary.BigEndian.PutUint16(b[8:], streamVersion)
	binary.BigEndian.PutUint64(b[16:], ring.Addr)
	binary.BigEndian.PutUint32(b[24:], uint32(ring.Len))
	binary.BigEndian.PutUint32(b[28:], ring.RKey)
}

// ringState is the protocol state of one stream, without any I/O: what
// the fuzzer drives, and what the connection consults for every message
// and every byte. Counters are cumulative byte counts.
type ringState struct {
	// Receive side: our ring.
	rsize    uint64 // its size
	rcvd     uint64 // bytes the peer wrote into it
	read     uint64 // bytes the application has read from it
	credited uint64 // read, as last told to the peer
	hello    bool   // the peer's hello arrived
	fin      bool   // the peer's fin arrived

	// Send side: the peer's ring, and our staging ring.
	peer      rdma.RemoteRegion
	wsize     uint64 // its size; 0 until the peer's hello
	ssize     uint64 // our staging ring's size: min(wsize, maxStage)
	maxStage  uint64 // staging's bound (maxStaging; smaller in tests)
	queued    uint64 // bytes copied into staging
	sent      uint64 // of those, posted
	completed uint64 // of those, whose WRITE completed here
	acked     uint64 // of those, read by the peer (its credits)

	// Header mode only: messages counted against receive windows.
	hdr      bool
	window   uint32 // the peer's receive window: its untaken messages at most
	rwindow  uint32 // ours
	msgs     uint32 // messages we sent, in all
	peerTook uint32 // of those, taken by the peer, as it last said
	took     uint32 // messages of the peer's we took
	told     uint32 // took, as we last said
}

func newRingState(rsize int) ringState {
	return ringState{rsize: uint64(rsize), maxStage: maxStaging}
}

// newHeaderState is the state of a stream in header mode whose peer
// takes window untaken messages at most, and we rwindow.
func newHeaderState(rsize, window, rwindow int) ringState {
	st := newRingState(rsize)
	st.hdr, st.window, st.rwindow = true, uint32(window), uint32(rwindow)
	return st
}

// imm is the header of a message of op, carrying our credits.
func (st *ringState) imm(op uint8) uint32 {
	st.credited = st.read
	return streamImm(op, st.read)
}

// header fills b with header mode's header of a message of op carrying
// n bytes (data) and counts the message sent.
func (st *ringState) header(b []byte, op uint8, n int) {
	binary.BigEndian.PutUint32(b, st.imm(op))
	binary.BigEndian.PutUint32(b[4:], uint32(n))
	binary.BigEndian.PutUint32(b[8:], st.took)
	st.told = st.took
	st.msgs++
}

// canSend says whether a message of op may go now: always with credits
// of the library's; in header mode while the peer's receive window has
// room for it (data, staged under stageRoom: all of it but the fin's
// slot; a fin or credits: all of it).
func (st *ringState) canSend(op uint8) bool {
	if !st.hdr {
		return true
	}
	limit := st.window
	if op == opData {
		limit--
	}
	return st.msgs-st.peerTook < limit
}

// stageRoom is, in header mode, how many more bytes may be staged: as
// many as fit in the messages that half the peer's window has left
// (less the messages untaken), counting from the bytes staged and not
// posted yet, up to the end of their second piece: posted together, as
// flushLocked posts them, they take at most two messages (a WRITE ends
// at the end of staging or of the peer's ring).
func (st *ringState) stageRoom() int {
	if !st.hdr {
		return int(st.wsize)
	}
	untaken := st.msgs - st.peerTook
	if untaken >= st.window/2 {
		return 0
	}
	end := st.sent
	for range min(st.window/2-untaken, 2) {
		end += st.piece(end)
	}
	end = min(end, st.sent+st.wsize)
	if end <= st.queued {
		return 0
	}
	return int(end - st.queued)
}

// tookDue says whether we have taken enough of the peer's messages since
// we last said so to say it on its own (header mode).
func (st *ringState) tookDue() bool {
	return st.hdr && st.took-st.told >= max(2, st.rwindow/4)
}

// unwrap turns a message as it arrived (its immediate value if it had
// one, its length, its payload; nil for a WRITE_WITH_IMM) into the
// header, length, written flag and body that onHello and onMessage
// check. In header mode it also applies the count of our messages the
// peer says it took.
func (st *ringState) unwrap(imm uint32, hasImm bool, n int, payload []byte) (uint32, int, bool, []byte, error) {
	if !st.hdr {
		if !hasImm {
			return 0, 0, false, nil, fmt.Errorf("%w: message of %d bytes without a stream header", ErrProtocol, n)
		}
		return imm, n, payload == nil, payload, nil
	}
	if hasImm || len(payload) < hdrSize {
		return 0, 0, false, nil, fmt.Errorf("%w: message of %d bytes without a stream header in its payload", ErrProtocol, n)
	}
	imm = binary.BigEndian.Uint32(payload)
	took := binary.BigEndian.Uint32(payload[8:])
	if took-st.peerTook > st.msgs-st.peerTook {
		return 0, 0, false, nil, fmt.Errorf("%w: peer took %d messages, %d untaken", ErrProtocol, took-st.peerTook, st.msgs-st.peerTook)
	}
	st.peerTook = took
	st.took++
	body := payload[hdrSize:]
	if imm>>immOpShift == opData {
		return imm, int(binary.BigEndian.Uint32(payload[4:])), len(body) == 0, nil, nil
	}
	return imm, len(body), false, body, nil
}

// creditDue says whether enough has been read since the last credits to
// send them on their own.
func (st *ringState) creditDue() bool {
	return !st.fin && st.read-st.credited >= st.rsize/4
}

// readable is where the next bytes to read are in the ring and how many
// are there contiguously.
func (st *ringState) readable() (off, n int) {
	pos := st.read % st.rsize
	return int(pos), int(min(st.rcvd-st.read, st.rsize-pos))
}

// free is how many bytes may be copied into staging now: the peer's
// ring holds what it has not credited, and staging what has not
// completed here.
func (st *ringState) free() int {
	if st.wsize == 0 {
		return 0
	}
	return int(min(st.wsize-(st.queued-st.acked), st.ssize-(st.queued-st.completed)))
}

// stagingFull says whether staging has no room until a WRITE completes
// (rather than until the peer credits).
func (st *ringState) stagingFull() bool {
	return st.ssize > 0 && st.queued-st.completed >= st.ssize
}

// writable is where the next k (at most n) bytes go in staging: a
// contiguous piece of what is free. k is 0 when nothing is.
func (st *ringState) writable(n int) (off, k int) {
	if st.wsize == 0 {
		return 0, 0
	}
	pos := st.queued % st.ssize
	return int(pos), min(n, st.free(), int(st.ssize-pos), st.cork(), st.stageRoom())
}

// cork is how many bytes may gather behind a WRITE in flight.
func (st *ringState) cork() int { return int(min(maxCork, st.wsize/2)) }

// nextWrite is the next WRITE to post: n bytes from sent, at soff in
// staging and roff in the peer's ring, up to queued or the end of either.
func (st *ringState) nextWrite() (soff, roff, n int) {
	return int(st.sent % st.ssize), int(st.sent % st.wsize), int(min(st.queued-st.sent, st.piece(st.sent)))
}

// piece is how many bytes from byte p of the stream one WRITE may carry
// at most: up to the end of staging or of the peer's ring.
func (st *ringState) piece(p uint64) uint64 {
	return min(st.ssize-p%st.ssize, st.wsize-p%st.wsize)
}

// onHello checks the peer's hello and learns its ring.
func (st *ringState) onHello(imm uint32, payload []byte) error {
	if imm>>immOpShift != opHello {
		return fmt.Errorf("%w: first message is not a stream hello; the peer is not a go-rdma stream", ErrProtocol)
	}
	if len(payload) != helloSize || string(payload[:8]) != streamMagic {
		return fmt.Errorf("%w: bad stream hello (%d bytes); the peer is not a go-rdma stream", ErrProtocol, len(payload))
	}
	if v := binary.BigEndian.Uint16(payload[8:]); v != streamVersion {
		return fmt.Errorf("%w: peer speaks stream version %d, ours %d", ErrProtocol, v, streamVersion)
	}
	if imm&creditMask != 0 {
		return fmt.Errorf("%w: hello with credits", ErrProtocol)
	}
	r := rdma.RemoteRegion{
		Addr: binary.BigEndian.Uint64(payload[16:]),
		Len:  int(binary.BigEndian.Uint32(payload[24:])),
		RKey: binary.BigEndian.Uint32(payload[28:]),
	}
	if r.Len < MinRingSize || r.Len > MaxRingSize {
		return fmt.Errorf("%w: peer's ring of %d bytes (a ring has %d to %d)", ErrProtocol, r.Len, MinRingSize, MaxRingSize)
	}
	st.hello, st.peer, st.wsize = true, r, uint64(r.Len)
	st.ssize = min(st.wsize, st.maxStage)
	return nil
}

// onMessage checks one message after the hello against the protocol
// and applies it: n is its length, written says it was a WRITE (no
// receive buffer). Any error is a protocol error and the stream is dead.
func (st *ringState) onMessage(imm uint32, n int, written bool) error {
	op := uint8(imm >> immOpShift)
	delta := (uint64(imm) - st.acked) & creditMask
	if delta > st.sent-st.acked {
		return fmt.Errorf("%w: peer credited %d bytes, %d unread", ErrProtocol, delta, st.sent-st.acked)
	}
	switch op {
	case opData:
		if st.fin {
			return fmt.Errorf("%w: data after fin", ErrProtocol)
		}
		if !written || n <= 0 {
			return fmt.Errorf("%w: data message of %d bytes not written into the ring", ErrProtocol, n)
		}
		if st.rcvd-st.read+uint64(n) > st.rsize {
			return fmt.Errorf("%w: peer overran the ring of %d bytes (%d unread, %d more)", ErrProtocol, st.rsize, st.rcvd-st.read, n)
		}
		if st.rcvd%st.rsize+uint64(n) > st.rsize {
			return fmt.Errorf("%w: data of %d bytes crosses the end of the ring", ErrProtocol, n)
		}
		st.rcvd += uint64(n)
	case opCredit, opFin:
		if written || n != 0 {
			return fmt.Errorf("%w: op %d with %d bytes", ErrProtocol, op, n)
		}
		if op == opFin {
			if st.fin {
				return fmt.Errorf("%w: second fin", ErrProtocol)
			}
			st.fin = true
		}
	case opHello:
		return fmt.Errorf("%w: second hello", ErrProtocol)
	default:
		return fmt.Errorf("%w: unknown op %d", ErrProtocol, op)
	}
	st.acked += delta
	return nil
}
