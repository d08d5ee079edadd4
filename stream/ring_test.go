package stream

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// The fuzz input is a script: a mode byte (odd: header mode, whose peer
// takes fuzzWindow untaken messages), then records of one op byte and
// its operands, run against a ringState whose ring and the peer's are
// fuzzRing bytes, and its staging fuzzStaging (which does not divide
// the ring, so that WRITEs end at the ends of both).
//
//	op%4 == 0: a message arrives: imm u32, length u16, flags u8, took u16
//	           (flags bit 0: written, no payload; bit 1: the other
//	           mode's encoding, without an immediate or with one;
//	           in header mode the payload is the header, then for a
//	           message that is not written, length bytes; took is how
//	           many more of our messages the peer says it took)
//	op%4 == 1: the application reads up to k bytes (operand u16)
//	op%4 == 2: the stream queues up to k bytes and posts them (u16)
//	op%4 == 3: the stream's WRITEs in flight complete
//
// The peer's hello has arrived: the script drives what follows it.
const (
	fuzzRing    = 8 << 10
	fuzzStaging = 3 << 10
	fuzzWindow  = 8
)

func fuzzState(t testing.TB, hdr bool) ringState {
	st := newRingState(fuzzRing)
	if hdr {
		st = newHeaderState(fuzzRing, fuzzWindow, fuzzWindow)
		var h [hdrSize]byte
		st.header(h[:], opHello, 0) // our hello is a message too
	}
	st.maxStage = fuzzStaging
	var hello [helloSize]byte
	marshalHello(hello[:], rdma.RemoteRegion{Addr: 1 << 20, Len: fuzzRing, RKey: 7})
	require.NoError(t, st.onHello(streamImm(opHello, 0), hello[:]))
	return st
}

// ringStep runs the script's next record on st. It returns the rest of
// the script, and the protocol error a message broke (the stream is
// dead then); ok is false when the script ends inside a record.
func ringStep(t testing.TB, st *ringState, script []byte) (rest []byte, ok bool, err error) {
	op := script[0]
	script = script[1:]
	next := func(n int) ([]byte, bool) {
		if len(script) < n {
			return nil, false
		}
		b := script[:n]
		script = script[n:]
		return b, true
	}
	var hdr [hdrSize]byte
	switch op % 4 {
	case 0:
		h, ok := next(9)
		if !ok {
			return nil, false, nil
		}
		imm, n, flags := binary.BigEndian.Uint32(h), int(binary.BigEndian.Uint16(h[4:])), h[6]
		var payload []byte
		if st.hdr {
			binary.BigEndian.PutUint32(hdr[:], imm)
			binary.BigEndian.PutUint32(hdr[4:], uint32(n))
			binary.BigEndian.PutUint32(hdr[8:], st.peerTook+uint32(binary.BigEndian.Uint16(h[7:])))
			payload = hdr[:]
			if flags&1 == 0 {
				payload = append(payload, make([]byte, n)...)
			}
		} else if flags&1 == 0 {
			payload = make([]byte, n)
		}
		imm, n, written, _, err := st.unwrap(imm, flags&2 == 0 != st.hdr, n, payload)
		if err == nil {
			err = st.onMessage(imm, n, written)
		}
		if err == nil && st.tookDue() && st.canSend(opCredit) {
			st.header(hdr[:], opCredit, 0)
		}
		return script, true, err
	case 1:
		b, ok := next(2)
		if !ok {
			return nil, false, nil
		}
		off, k := st.readable()
		k = min(k, int(binary.BigEndian.Uint16(b)))
		require.LessOrEqual(t, off+k, fuzzRing, "a read past the ring's end")
		st.read += uint64(k)
		if st.creditDue() {
			if !st.hdr {
				st.imm(opCredit)
			} else if st.canSend(opCredit) {
				st.header(hdr[:], opCredit, 0)
			}
		}
	case 2:
		b, ok := next(2)
		if !ok {
			return nil, false, nil
		}
		if st.free() == 0 {
			break
		}
		off, k := st.writable(int(binary.BigEndian.Uint16(b)))
		require.LessOrEqual(t, off+k, fuzzStaging, "staging past its end")
		st.queued += uint64(k)
		if st.hdr && k > 0 {
			require.LessOrEqual(t, piecesOf(st), st.window/2-(st.msgs-st.peerTook),
				"bytes staged that half the peer's window cannot carry")
		}
		for st.sent < st.queued && st.canSend(opData) {
			soff, off, n := st.nextWrite()
			require.Positive(t, n)
			require.LessOrEqual(t, off+n, fuzzRing, "a WRITE past the peer's ring")
			require.LessOrEqual(t, soff+n, fuzzStaging, "a WRITE past staging")
			if st.hdr {
				st.header(hdr[:], opData, n)
			}
			st.sent += uint64(n)
		}
	case 3:
		st.completed = st.sent
	}
	return script, true, nil
}

// piecesOf is how many WRITEs the bytes staged and not posted take when
// posted together, as flushLocked posts them.
func piecesOf(st *ringState) uint32 {
	n := uint32(0)
	for p := st.sent; p < st.queued; n++ {
		p += min(st.queued-p, st.piece(p))
	}
	return n
}

func runRingScript(t testing.TB, script []byte) {
	if len(script) == 0 {
		return
	}
	st := fuzzState(t, script[0]&1 != 0)
	script = script[1:]
	for len(script) > 0 {
		before := st
		var ok bool
		var err error
		if script, ok, err = ringStep(t, &st, script); !ok {
			return
		}
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return // the stream is dead
		}
		require.GreaterOrEqual(t, st.acked, before.acked, "credits went back")
		require.LessOrEqual(t, st.read, st.rcvd)
		require.LessOrEqual(t, st.rcvd-st.read, uint64(fuzzRing), "more unread than the ring holds")
		require.LessOrEqual(t, st.queued-st.acked, uint64(fuzzRing), "more unacked than the peer's ring holds")
		require.LessOrEqual(t, st.acked, st.sent)
		require.LessOrEqual(t, st.queued-st.completed, uint64(fuzzStaging), "more uncompleted than staging holds")
		require.LessOrEqual(t, st.free(), fuzzStaging)
		if st.hdr {
			require.LessOrEqual(t, st.msgs-st.peerTook, uint32(fuzzWindow), "more untaken messages than the peer's window")
			require.LessOrEqual(t, st.peerTook-before.peerTook, st.msgs-before.peerTook, "the peer took more than we sent")
		}
	}
}

func FuzzRing(f *testing.F) {
	for _, s := range ringFuzzSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, script []byte) { runRingScript(t, script) })
}

type ringSeed struct {
	name string
	data []byte
	rule string // what the protocol error that ends it says; "" for none
}

// ringFuzzSeeds are the seed corpus, also checked in under
// testdata/fuzz/FuzzRing (TestRingFuzzSeeds keeps them equal).
func ringFuzzSeeds() []ringSeed {
	msgTook := func(op uint8, credits uint64, n int, flags byte, took int) []byte {
		b := binary.BigEndian.AppendUint32([]byte{0}, streamImm(op, credits))
		b = binary.BigEndian.AppendUint16(b, uint16(n))
		b = append(b, flags)
		return binary.BigEndian.AppendUint16(b, uint16(took))
	}
	msg := func(op uint8, credits uint64, n int, written bool) []byte {
		if written {
			return msgTook(op, credits, n, 1, 0)
		}
		return msgTook(op, credits, n, 0, 0)
	}
	u16 := func(op byte, k int) []byte { return binary.BigEndian.AppendUint16([]byte{op}, uint16(k)) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	data := func(n int) []byte { return msg(opData, 0, n, true) }
	imm, hdr := []byte{0}, []byte{1}
	return []ringSeed{
		{"data-read-fin", cat(imm, data(100), u16(1, 60), u16(1, 60), msg(opFin, 0, 0, false)), ""},
		{"write-credit", cat(imm, u16(2, 3000), []byte{3}, msg(opCredit, 3000, 0, false), u16(2, 8000)), ""},
		{"wrap", cat(imm, data(8000), u16(1, 8000), data(192), data(500), u16(1, 9000), u16(1, 9000)), ""},
		// Staging (3 KiB) and the ring (8 KiB) wrap at different bytes.
		{"write-wrap", cat(imm, u16(2, 3072), []byte{3}, msg(opCredit, 3072, 0, false), u16(2, 3072), []byte{3}, msg(opCredit, 6144, 0, false),
			u16(2, 3072), []byte{3}, msg(opCredit, 9216, 0, false), u16(2, 3072), []byte{3}, msg(opCredit, 12288, 0, false), u16(2, 100)), ""},
		{"piggyback", cat(imm, u16(2, 100), data(10), msg(opData, 100, 5, true)), ""},
		// Past the ring's end the peer's data starts at offset 0 again,
		// so an overrun there crosses no end: only its own rule stops it.
		{"overrun", cat(imm, data(8000), u16(1, 8000), data(192), data(8100)), "overran the ring"},
		{"crosses-end", cat(imm, data(8000), u16(1, 8000), data(500)), "crosses the end of the ring"},
		{"empty-data", cat(imm, data(0)), "data message of 0 bytes not written"},
		{"data-as-send", cat(imm, msg(opData, 0, 10, false)), "data message of 10 bytes not written"},
		{"credit-with-bytes", cat(imm, msg(opCredit, 0, 0, true)), fmt.Sprintf("op %d with 0 bytes", opCredit)},
		{"too-many-credits", cat(imm, u16(2, 100), msg(opCredit, 101, 0, false)), "peer credited 101 bytes, 100 unread"},
		{"credits-never-sent", cat(imm, msg(opCredit, 1, 0, false)), "peer credited 1 bytes, 0 unread"},
		{"data-after-fin", cat(imm, msg(opFin, 0, 0, false), data(3)), "data after fin"},
		{"two-fins", cat(imm, msg(opFin, 0, 0, false), msg(opFin, 0, 0, false)), "second fin"},
		{"second-hello", cat(imm, msg(opHello, 0, 0, false)), "second hello"},
		{"unknown-op", cat(imm, msg(7, 0, 0, false)), "unknown op 7"},
		{"no-imm", cat(imm, msgTook(opCredit, 0, 0, 2, 0)), "without a stream header"},
		// Header mode: the header in a SEND's payload, messages counted.
		{"hdr-data-read-fin", cat(hdr, data(100), u16(1, 100), msg(opFin, 0, 0, false)), ""},
		{"hdr-window", cat(hdr, u16(2, 10), []byte{3}, msgTook(opCredit, 10, 0, 0, 2), u16(2, 10), []byte{3}, u16(2, 10), u16(2, 10), u16(2, 10), u16(2, 10), msgTook(opCredit, 30, 0, 0, 3)), ""},
		{"hdr-write-wrap", cat(hdr, u16(2, 3072), []byte{3}, msgTook(opCredit, 3072, 0, 0, 1), u16(2, 3072), []byte{3}, msgTook(opCredit, 6144, 0, 0, 1),
			u16(2, 3072), []byte{3}, msgTook(opCredit, 9216, 0, 0, 2), u16(2, 100)), ""},
		{"hdr-took-reported", cat(hdr, data(1), data(1), data(1), u16(1, 3)), ""},
		{"hdr-with-imm", cat(hdr, msgTook(opCredit, 0, 0, 2, 0)), "without a stream header in its payload"},
		{"hdr-data-with-body", cat(hdr, msg(opData, 0, 10, false)), "data message of 10 bytes not written"},
		{"hdr-took-more-than-sent", cat(hdr, u16(2, 10), msgTook(opCredit, 0, 0, 0, 3)), "peer took 3 messages, 2 untaken"},
		{"hdr-credit-with-body", cat(hdr, msg(opCredit, 0, 4, false)), fmt.Sprintf("op %d with 4 bytes", opCredit)},
	}
}

func TestRingFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzRing")
	for _, s := range ringFuzzSeeds() {
		runRingScript(t, s.data)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s.data)))
		path := filepath.Join(dir, s.name)
		if os.Getenv("STREAM_UPDATE_SEEDS") == "1" {
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("seed %s is stale or missing (regenerate with STREAM_UPDATE_SEEDS=1): %v", path, err)
		}
	}
}

// TestRingRules: each seed ends in a protocol error exactly when it says
// so, and by the rule it names, so the fuzzer starts from every rule.
func TestRingRules(t *testing.T) {
	for _, s := range ringFuzzSeeds() {
		st := fuzzState(t, s.data[0]&1 != 0)
		script := s.data[1:]
		var err error
		for ok := true; ok && len(script) > 0 && err == nil; {
			script, ok, err = ringStep(t, &st, script)
			require.True(t, ok, "%s ends inside a record", s.name)
		}
		if s.rule != "" {
			require.ErrorIs(t, err, ErrProtocol, s.name)
			require.ErrorContains(t, err, s.rule, "%s is stopped by another rule", s.name)
		} else {
			require.NoError(t, err, s.name)
		}
	}
}

// TestRingHello: a hello that is not ours, of another version, or with a
// ring out of bounds is refused.
func TestRingHello(t *testing.T) {
	good := func() []byte {
		b := make([]byte, helloSize)
		marshalHello(b, rdma.RemoteRegion{Addr: 4096, Len: DefaultRingSize, RKey: 1})
		return b
	}
	st := newRingState(DefaultRingSize)
	require.NoError(t, st.onHello(streamImm(opHello, 0), good()))
	require.Equal(t, uint64(DefaultRingSize), st.wsize)
	for name, mutate := range map[string]func([]byte){
		"magic":    func(b []byte) { b[0] = 'X' },
		"version":  func(b []byte) { b[9] = 1 },
		"tiny":     func(b []byte) { binary.BigEndian.PutUint32(b[24:], MinRingSize-1) },
		"huge":     func(b []byte) { binary.BigEndian.PutUint32(b[24:], MaxRingSize+1) },
		"short":    nil,
		"not-send": nil,
	} {
		b := good()
		imm := streamImm(opHello, 0)
		switch name {
		case "short":
			b = b[:20]
		case "not-send":
			imm = streamImm(opData, 0)
		default:
			mutate(b)
		}
		st := newRingState(DefaultRingSize)
		require.ErrorIs(t, st.onHello(imm, b), ErrProtocol, name)
	}
}
