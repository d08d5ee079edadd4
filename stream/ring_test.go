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

// The fuzz input is a script: records of one op byte and its operands,
// run against a ringState whose ring and the peer's are fuzzRing bytes.
//
//	op%4 == 0: a message arrives: imm u32, length u16, written u8
//	op%4 == 1: the application reads up to k bytes (operand u16)
//	op%4 == 2: the stream queues up to k bytes and posts them (u16)
//	op%4 == 3: the stream's WRITEs in flight complete
//
// The peer's hello has arrived: the script drives what follows it.
const fuzzRing = 8 << 10

func fuzzState(t testing.TB) ringState {
	st := newRingState(fuzzRing)
	var hello [helloSize]byte
	marshalHello(hello[:], rdma.RemoteRegion{Addr: 1 << 20, Len: fuzzRing, RKey: 7})
	require.NoError(t, st.onHello(streamImm(opHello, 0), true, hello[:]))
	return st
}

func runRingScript(t testing.TB, script []byte) {
	st := fuzzState(t)
	next := func(n int) ([]byte, bool) {
		if len(script) < n {
			return nil, false
		}
		b := script[:n]
		script = script[n:]
		return b, true
	}
	for len(script) > 0 {
		op := script[0]
		script = script[1:]
		switch op % 4 {
		case 0:
			h, ok := next(7)
			if !ok {
				return
			}
			before := st
			err := st.onMessage(binary.BigEndian.Uint32(h), true, int(binary.BigEndian.Uint16(h[4:])), h[6]&1 != 0)
			if err != nil {
				require.ErrorIs(t, err, ErrProtocol)
				return // the stream is dead
			}
			require.GreaterOrEqual(t, st.acked, before.acked, "credits went back")
		case 1:
			b, ok := next(2)
			if !ok {
				return
			}
			off, k := st.readable()
			k = min(k, int(binary.BigEndian.Uint16(b)))
			require.LessOrEqual(t, off+k, fuzzRing, "a read past the ring's end")
			st.read += uint64(k)
			if st.creditDue() {
				st.imm(opCredit)
			}
		case 2:
			b, ok := next(2)
			if !ok {
				return
			}
			if st.free() == 0 {
				continue
			}
			off, k := st.writable(int(binary.BigEndian.Uint16(b)))
			require.LessOrEqual(t, off+k, fuzzRing, "staging past its end")
			st.queued += uint64(k)
			for st.sent < st.queued {
				off, n := st.nextWrite()
				require.Positive(t, n)
				require.LessOrEqual(t, off+n, fuzzRing, "a WRITE past the peer's ring")
				st.sent += uint64(n)
			}
		case 3:
			st.completed = st.sent
		}
		require.LessOrEqual(t, st.read, st.rcvd)
		require.LessOrEqual(t, st.rcvd-st.read, uint64(fuzzRing), "more unread than the ring holds")
		require.LessOrEqual(t, st.queued-st.acked, uint64(fuzzRing), "more unacked than the peer's ring holds")
		require.LessOrEqual(t, st.acked, st.sent)
		require.LessOrEqual(t, st.free(), fuzzRing)
	}
}

func FuzzRing(f *testing.F) {
	for _, s := range ringFuzzSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, script []byte) { runRingScript(t, script) })
}

type ringSeed struct {
	name    string
	data    []byte
	wantErr bool
}

// ringFuzzSeeds are the seed corpus, also checked in under
// testdata/fuzz/FuzzRing (TestRingFuzzSeeds keeps them equal).
func ringFuzzSeeds() []ringSeed {
	msg := func(op uint8, credits uint64, n int, written bool) []byte {
		b := binary.BigEndian.AppendUint32([]byte{0}, streamImm(op, credits))
		b = binary.BigEndian.AppendUint16(b, uint16(n))
		if written {
			return append(b, 1)
		}
		return append(b, 0)
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
	return []ringSeed{
		{"data-read-fin", cat(data(100), u16(1, 60), u16(1, 60), msg(opFin, 0, 0, false)), false},
		{"write-credit", cat(u16(2, 3000), []byte{3}, msg(opCredit, 3000, 0, false), u16(2, 8000)), false},
		{"wrap", cat(data(8000), u16(1, 8000), data(192), data(500), u16(1, 9000), u16(1, 9000)), false},
		{"write-wrap", cat(u16(2, 4096), []byte{3}, msg(opCredit, 4096, 0, false), u16(2, 4096), []byte{3}, msg(opCredit, 8192, 0, false), u16(2, 100)), false},
		{"piggyback", cat(u16(2, 100), data(10), msg(opData, 100, 5, true)), false},
		{"overrun", cat(data(8000), data(500)), true},
		{"crosses-end", cat(data(8000), u16(1, 8000), data(500)), true},
		{"empty-data", data(0), true},
		{"data-as-send", msg(opData, 0, 10, false), true},
		{"credit-with-bytes", msg(opCredit, 0, 0, true), true},
		{"too-many-credits", cat(u16(2, 100), msg(opCredit, 101, 0, false)), true},
		{"credits-never-sent", msg(opCredit, 1, 0, false), true},
		{"data-after-fin", cat(msg(opFin, 0, 0, false), data(3)), true},
		{"two-fins", cat(msg(opFin, 0, 0, false), msg(opFin, 0, 0, false)), true},
		{"second-hello", msg(opHello, 0, 0, false), true},
		{"unknown-op", msg(7, 0, 0, false), true},
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
// so, so the fuzzer starts from every rule.
func TestRingRules(t *testing.T) {
	for _, s := range ringFuzzSeeds() {
		st := fuzzState(t)
		script := s.data
		var err error
		for len(script) > 0 && err == nil {
			switch script[0] % 4 {
			case 0:
				h := script[1:8]
				err = st.onMessage(binary.BigEndian.Uint32(h), true, int(binary.BigEndian.Uint16(h[4:])), h[6]&1 != 0)
				script = script[8:]
			case 1:
				_, k := st.readable()
				st.read += uint64(min(k, int(binary.BigEndian.Uint16(script[1:]))))
				script = script[3:]
			case 2:
				if st.free() > 0 {
					_, k := st.writable(int(binary.BigEndian.Uint16(script[1:])))
					st.queued += uint64(k)
					st.sent = st.queued
				}
				script = script[3:]
			case 3:
				st.completed = st.sent
				script = script[1:]
			}
		}
		if s.wantErr {
			require.ErrorIs(t, err, ErrProtocol, s.name)
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
	require.NoError(t, st.onHello(streamImm(opHello, 0), true, good()))
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
		require.ErrorIs(t, st.onHello(imm, true, b), ErrProtocol, name)
	}
}
