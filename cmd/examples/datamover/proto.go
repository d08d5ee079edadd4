package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"time"

	"github.com/go-rdma/rdma"
)

// The messages of the protocol, carried by Send and Recv. Each starts
// with its type byte; numbers are big-endian.
const (
	msgStart   = 'S' // sender: size u64, chunk u32, checksum u8 (sumSHA256, sumCRC32C)
	msgReady   = 'R' // receiver: slots u32, slot size u64, region (20 bytes)
	msgAck     = 'A' // receiver: window u32 consumed; its slot is free
	msgDone    = 'D' // sender: chunks u32, checksum [32] (a CRC-32C in its first 4 bytes)
	msgVerdict = 'V' // receiver: ok u8, checksum [32] of what it received
	msgAbort   = 'E' // either: why it gives up (text)

	maxMsg = 1024 // largest message either side accepts
)

// peer wraps a connection with message helpers. It remembers receives it
// stopped waiting for, so close can release what they still deliver.
type peer struct {
	conn      *rdma.Conn
	abandoned []*rdma.Future
}

// send sends one message and waits for it to complete.
func (p *peer) send(ctx context.Context, msg []byte) error {
	b, err := p.conn.Alloc(len(msg))
	if err != nil {
		return err
	}
	copy(b.Bytes(), msg)
	f := p.conn.Send(b)
	b.Release() // the send keeps the memory until it completes
	return f.Wait(ctx)
}

// abort tells the peer why we give up, bounded by a second.
func (p *peer) abort(why error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	msg := []byte{msgAbort}
	msg = append(msg, why.Error()...)
	p.send(ctx, msg[:min(len(msg), maxMsg)])
}

// recv waits for the next receive: a message (note.msg) or a
// WRITE_WITH_IMM notification (note.imm, note.n).
func (p *peer) recv(ctx context.Context) (note, error) {
	f := p.conn.Recv()
	if err := f.Wait(ctx); err != nil {
		if !f.Resolved() {
			p.abandoned = append(p.abandoned, f)
		}
		return note{}, err
	}
	if b := f.Buffer(); b != nil {
		msg := append([]byte(nil), b.Bytes()...)
		b.Release()
		if len(msg) == 0 {
			return note{}, errors.New("protocol: empty message")
		}
		if msg[0] == msgAbort {
			return note{}, fmt.Errorf("the peer gave up: %q", msg[1:])
		}
		return note{msg: msg}, nil
	}
	imm, ok := f.Imm()
	if !ok {
		return note{}, errors.New("protocol: a receive with neither message nor immediate")
	}
	return note{imm: imm, n: f.Len(), write: true}, nil
}

// expect receives a message of type typ and length n.
func (p *peer) expect(ctx context.Context, typ byte, n int) ([]byte, error) {
	nt, err := p.recv(ctx)
	if err != nil {
		return nil, err
	}
	if nt.write {
		return nil, fmt.Errorf("protocol: a write (chunk %d) where message %q was due", nt.imm, typ)
	}
	if nt.msg[0] != typ || len(nt.msg) != n {
		return nil, fmt.Errorf("protocol: message %q of %d bytes where %q of %d was due", nt.msg[0], len(nt.msg), typ, n)
	}
	return nt.msg, nil
}

// awaitClose gives the peer a moment to close first, after it has read
// our last message, so that it does not see us go before it got it.
func (p *peer) awaitClose(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		if _, err := p.recv(ctx); err != nil {
			return
		}
	}
}

// close closes the connection, then releases what abandoned receives
// delivered after all.
func (p *peer) close() {
	p.conn.Close()
	for _, f := range p.abandoned {
		if b := f.Buffer(); b != nil {
			b.Release()
		}
	}
}

type note struct {
	msg   []byte // a message, or
	write bool   // a WRITE_WITH_IMM:
	imm   uint32 // its immediate (the chunk index)
	n     int    // and its length
}

func startMsg(size int64, chunk int, sum checksum) []byte {
	b := []byte{msgStart}
	b = binary.BigEndian.AppendUint64(b, uint64(size))
	b = binary.BigEndian.AppendUint32(b, uint32(chunk))
	return append(b, byte(sum))
}

const startLen = 1 + 8 + 4 + 1

// checksum is how both ends check the data: the sender's choice, which
// the receiver follows.
type checksum byte

const (
	sumSHA256 checksum = 0 // SHA-256: about 2 GB/s a core with SHA-NI
	sumCRC32C checksum = 1 // CRC-32C (Castagnoli): about 20 GB/s, with SSE 4.2
)

func parseChecksum(s string) (checksum, error) {
	switch s {
	case "sha256":
		return sumSHA256, nil
	case "crc32c":
		return sumCRC32C, nil
	}
	return 0, fmt.Errorf("%q: want sha256 or crc32c", s)
}

func (c checksum) String() string {
	switch c {
	case sumSHA256:
		return "sha256"
	case sumCRC32C:
		return "crc32c"
	}
	return fmt.Sprintf("checksum(%d)", byte(c))
}

// new returns the hash, or nil for an unknown checksum.
func (c checksum) new() hash.Hash {
	switch c {
	case sumSHA256:
		return sha256.New()
	case sumCRC32C:
		return crc32.New(crc32.MakeTable(crc32.Castagnoli))
	}
	return nil
}

// size is how many bytes of a [sha256.Size] field the checksum uses.
func (c checksum) size() int {
	if c == sumCRC32C {
		return crc32.Size
	}
	return sha256.Size
}

func readyMsg(slots int, slotSize int64, r rdma.RemoteRegion) []byte {
	b := []byte{msgReady}
	b = binary.BigEndian.AppendUint32(b, uint32(slots))
	b = binary.BigEndian.AppendUint64(b, uint64(slotSize))
	rb, _ := r.MarshalBinary()
	return append(b, rb...)
}

const readyLen = 1 + 4 + 8 + 20

func ackMsg(w int) []byte {
	return binary.BigEndian.AppendUint32([]byte{msgAck}, uint32(w))
}

func doneMsg(chunks int64, sum [sha256.Size]byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{msgDone}, uint32(chunks))
	return append(b, sum[:]...)
}

const doneLen = 1 + 4 + sha256.Size

func verdictMsg(ok bool, sum [sha256.Size]byte) []byte {
	b := []byte{msgVerdict, 0}
	if ok {
		b[1] = 1
	}
	return append(b, sum[:]...)
}

const verdictLen = 2 + sha256.Size

// layout is how the data maps onto the receiver's region: windows of
// slotSize bytes (a whole number of chunks) go into slots in turn.
type layout struct {
	size     int64
	chunk    int64
	slots    int
	slotSize int64
}

// planLayout is the receiver's choice: one slot when the data fits in
// window, else two slots of about window/2 each (at least a chunk).
func planLayout(size, chunk, window int64) layout {
	l := layout{size: size, chunk: chunk, slots: 1}
	need := max(roundUp(size, chunk), chunk)
	if need <= window {
		l.slotSize = need
		return l
	}
	l.slots = 2
	l.slotSize = max(chunk, window/2/chunk*chunk)
	return l
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// chunks is the number of chunks of the data.
func (l layout) chunks() int64 { return (l.size + l.chunk - 1) / l.chunk }

// windows is the number of windows of the data.
func (l layout) windows() int { return int((l.size + l.slotSize - 1) / l.slotSize) }

// perWindow is the number of chunks in a full window.
func (l layout) perWindow() int64 { return l.slotSize / l.chunk }

// window is where window w starts in the data and how long it is.
func (l layout) window(w int) (off, n int64) {
	off = int64(w) * l.slotSize
	return off, min(l.slotSize, l.size-off)
}

// chunkAt is chunk i's place: its window, its offset in the data, its
// offset in the region and its length.
func (l layout) chunkAt(i int64) (w int, off, at, n int64) {
	w = int(i / l.perWindow())
	off = i * l.chunk
	at = int64(w%l.slots)*l.slotSize + (i%l.perWindow())*l.chunk
	return w, off, at, min(l.chunk, l.size-off)
}

// chunksIn is the number of chunks in window w.
func (l layout) chunksIn(w int) int64 {
	_, n := l.window(w)
	return (n + l.chunk - 1) / l.chunk
}

// check validates a layout that came over the wire.
func (l layout) check(region rdma.RemoteRegion) error {
	switch {
	case l.slots < 1 || l.slots > 2:
		return fmt.Errorf("protocol: %d slots", l.slots)
	case l.slotSize < l.chunk || l.slotSize%l.chunk != 0:
		return fmt.Errorf("protocol: slot of %d bytes for %d-byte chunks", l.slotSize, l.chunk)
	case int64(region.Len) < int64(l.slots)*l.slotSize:
		return fmt.Errorf("protocol: a %d-byte region for %d slots of %d bytes", region.Len, l.slots, l.slotSize)
	}
	return nil
}
