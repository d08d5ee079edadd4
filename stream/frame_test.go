package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The fuzz input is a script: records of one op byte and its operands.
//
//	op&3 == 0: a message arrives: imm u32, len u8, then len payload
//	           bytes; op&4 says whether it carries an immediate value
//	op&3 == 1: the application consumes k data messages (operand byte)
//	op&3 == 2: the stream takes the credits to return
//	op&3 == 3: the stream sends k data messages (operand byte), if its
//	           credits allow
//
// The state starts as if the peer's window were full of our messages.

const fuzzGrant, fuzzWindow = 6, 5

func runStreamScript(t testing.TB, script []byte) {
	st := newStreamState(fuzzGrant, fuzzWindow)
	st.sent(fuzzWindow)
	received := 0 // data messages accepted and not yet consumed
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
		switch op & 3 {
		case 0:
			h, ok := next(5)
			if !ok {
				return
			}
			payload, ok := next(int(h[4]))
			if !ok {
				return
			}
			fin := st.fin
			before := st.outstanding
			kind, err := st.onMessage(binary.BigEndian.Uint32(h), op&4 != 0, payload)
			if err != nil {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("error %v does not wrap ErrProtocol", err)
				}
				return // the stream is dead
			}
			if kind == frameData {
				if fin || len(payload) == 0 {
					t.Fatal("data accepted after fin, or empty")
				}
				received++
			}
			if st.outstanding > before {
				t.Fatal("a message increased the outstanding count")
			}
		case 1:
			b, ok := next(1)
			if !ok {
				return
			}
			k := min(int(b[0]), received)
			received -= k
			st.consumed(k)
		case 2:
			st.take()
		case 3:
			b, ok := next(1)
			if !ok {
				return
			}
			if k := int(b[0]); k <= st.credits() {
				st.sent(k)
			}
		}
		if st.outstanding < 0 || st.outstanding > st.window {
			t.Fatalf("outstanding %d outside [0, %d]", st.outstanding, st.window)
		}
		if st.unacked < 0 || st.unacked > st.grant || st.pending > st.unacked || st.pending < 0 {
			t.Fatalf("unacked %d, pending %d, grant %d", st.unacked, st.pending, st.grant)
		}
		if received+st.pending != st.unacked {
			t.Fatalf("received %d + pending %d != unacked %d", received, st.pending, st.unacked)
		}
	}
}

func FuzzFrames(f *testing.F) {
	for _, s := range streamFuzzSeeds() {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, script []byte) { runStreamScript(t, script) })
}

type streamSeed struct {
	name string
	data []byte
}

// streamFuzzSeeds are the seed corpus, also checked in under
// testdata/fuzz/FuzzFrames (TestStreamFuzzSeeds keeps them equal).
func streamFuzzSeeds() []streamSeed {
	msg := func(kind uint8, credits int, hasImm bool, payload []byte) []byte {
		op := byte(0)
		if hasImm {
			op = 4
		}
		b := []byte{op}
		b = binary.BigEndian.AppendUint32(b, streamImm(kind, credits))
		b = append(b, byte(len(payload)))
		return append(b, payload...)
	}
	hello := msg(frameHello, 0, true, streamHello())
	data := func(credits int, s string) []byte { return msg(frameData, credits, true, []byte(s)) }
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	badVersion := streamHello()
	badVersion[9] = 9
	var overrun [][]byte
	for i := 0; i <= fuzzGrant; i++ {
		overrun = append(overrun, data(0, "x"))
	}
	return []streamSeed{
		{"hello-data-fin", cat(hello, data(0, "abc"), data(2, "de"), msg(frameFin, 1, true, nil))},
		{"credits", cat(hello, msg(frameCredit, 3, true, nil), msg(frameCredit, 2, true, nil), []byte{3, 4})},
		{"consume-take", cat(hello, data(0, "a"), data(0, "b"), []byte{1, 2, 2}, data(1, "c"), []byte{1, 1, 2})},
		{"no-hello", data(0, "abc")},
		{"no-imm", cat(hello, msg(frameData, 0, false, []byte("abc")))},
		{"bad-magic", msg(frameHello, 0, true, []byte("GRDMA-XX\x00\x01\x00\x00\x00\x00\x00\x00"))},
		{"bad-version", msg(frameHello, 0, true, badVersion)},
		{"two-hellos", cat(hello, hello)},
		{"data-after-fin", cat(hello, msg(frameFin, 0, true, nil), data(0, "late"))},
		{"too-many-credits", cat(hello, msg(frameCredit, fuzzWindow+1, true, nil))},
		{"overrun", cat(append([][]byte{hello}, overrun...)...)},
		{"empty-data", cat(hello, msg(frameData, 0, true, nil))},
		{"unknown-kind", cat(hello, msg(9, 0, true, nil))},
		{"zero-credit", cat(hello, msg(frameCredit, 0, true, nil))},
	}
}

func TestStreamFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzFrames")
	for _, s := range streamFuzzSeeds() {
		runStreamScript(t, s.data)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(s.data)))
		path := filepath.Join(dir, s.name)
		if os.Getenv("STREAM_UPDATE_SEEDS") == "1" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Errorf("seed %s is stale or missing (regenerate with STREAM_UPDATE_SEEDS=1): %v", path, err)
		}
	}
}

// TestStreamStateRules: the protocol errors the fuzzer may reach are
// reached by the seeds, and a normal exchange is accepted.
func TestStreamStateRules(t *testing.T) {
	for _, s := range streamFuzzSeeds() {
		st := newStreamState(fuzzGrant, fuzzWindow)
		st.sent(fuzzWindow)
		script := s.data
		var err error
		for len(script) > 0 && err == nil {
			op := script[0]
			switch op & 3 {
			case 1, 3: // consume, send: ignored here
				script = script[2:]
				continue
			case 2:
				st.take()
				script = script[1:]
				continue
			}
			n := int(script[5])
			_, err = st.onMessage(binary.BigEndian.Uint32(script[1:]), op&4 != 0, script[6:6+n])
			script = script[6+n:]
		}
		wantErr := map[string]bool{"hello-data-fin": false, "credits": false, "consume-take": false}
		if ok, listed := wantErr[s.name]; listed && !ok {
			if err != nil {
				t.Errorf("%s: %v", s.name, err)
			}
		} else if !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", s.name, err)
		}
	}
}
