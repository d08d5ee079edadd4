package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/leak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(leak.Checked(m))
}

// syncBuffer is a bytes.Buffer that run may write from several goroutines
// while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runCmd runs the command in-process, bounded in time.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb syncBuffer
	code = run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSelfGenerated(t *testing.T) {
	code, out, errs := runCmd(t, "-self", "-gen", "8MiB", "-j", "4", "-provider", "soft")
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if !strings.Contains(out, "checksum OK") || !strings.Contains(out, "the receiver verified sha256") {
		t.Errorf("no verdict in the output:\n%s", out)
	}
	if !strings.Contains(out, "8 chunks of 1.0 MiB, 4 workers") {
		t.Errorf("unexpected plan:\n%s", out)
	}
	// stderr is no terminal here: the progress bar prints whole lines.
	if !strings.Contains(errs, "send [") || !strings.Contains(errs, "100%") || strings.Contains(errs, "\r") {
		t.Errorf("progress on stderr:\n%q", errs)
	}
}

// TestSelfCRC32C checks the data with -sum crc32c, in windows: the
// receiver follows the sender's choice and writes the same file.
func TestSelfCRC32C(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	data := make([]byte, 3<<20+123)
	genSource{size: int64(len(data))}.ReadAt(data, 0)
	require.NoError(t, os.WriteFile(in, data, 0o644))
	code, stdout, stderr := runCmd(t, "-self", "-i", in, "-o", out, "-sum", "crc32c", "-window", "1MiB", "-chunk", "128KiB", "-q", "-provider", "soft")
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	want := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	assert.Contains(t, stdout, fmt.Sprintf("the receiver verified crc32c %08x", want))
	assert.Contains(t, stdout, fmt.Sprintf("checksum OK, crc32c %08x", want))
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got), "the output differs from the input")
}

// TestMismatchCRC32C: a mismatch is found with CRC-32C too.
func TestMismatchCRC32C(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []rdma.Option{rdma.WithProvider("soft"), rdma.WithMaxMessage(maxMsg)}
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	require.NoError(t, err)
	defer ln.Close()
	var log syncBuffer
	none := progressTo(nil, true, false)
	r := &receiver{window: 1 << 20, log: &log, progress: none}
	s := &sender{src: &lyingSource{genSource: genSource{size: 3 << 20}}, sum: sumCRC32C, chunk: 1 << 20, jobs: 2, log: &log, progress: none}
	var g errgroup.Group
	var rerr, serr error
	g.Go(func() error { rerr = r.run(ctx, ln); return nil })
	g.Go(func() error { serr = s.run(ctx, ln.Addr().String(), opts); return nil })
	g.Wait()
	require.ErrorIs(t, rerr, errMismatch, log.String())
	require.ErrorIs(t, serr, errMismatch, log.String())
	assert.Contains(t, log.String(), "checksum MISMATCH: ours crc32c")
}

// TestSelfFileWindows sends a file larger than the receiver's region, so
// it goes in windows through two slots, and checks the output file.
func TestSelfFileWindows(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, "-self", "-i", in, "-o", out, "-window", "1MiB", "-chunk", "64KiB", "-j", "3", "-q", "-provider", "soft")
	if code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "7 window(s) in 2 slot(s) of 512.0 KiB") {
		t.Errorf("expected 7 windows in 2 slots:\n%s", stdout)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("output differs from input (%d vs %d bytes)", len(got), len(data))
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Errorf("the .part file is left: %v", err)
	}
}

// TestTwoEnds runs a receiver (-l) and a sender (-addr) as separate runs,
// the way two processes would, and checks the generated data arrived.
func TestTwoEnds(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rout, rerr syncBuffer
	recvCode := make(chan int, 1)
	go func() {
		recvCode <- run(ctx, []string{"-l", "127.0.0.1:0", "-o", out, "-window", "2MiB", "-provider", "soft", "-poll", "event"}, &rout, &rerr)
	}()
	addr := waitFor(t, &rout, regexp.MustCompile(`listening on (\S+)`))
	code, sout, serr := runCmd(t, "-addr", addr, "-gen", "5MiB", "-chunk", "256KiB", "-j", "2", "-provider", "soft", "-poll", "busy")
	if code != 0 {
		t.Fatalf("sender: exit code %d\n%s%s", code, sout, serr)
	}
	if c := <-recvCode; c != 0 {
		t.Fatalf("receiver: exit code %d\n%s%s", c, rout.String(), rerr.String())
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 5<<20)
	genSource{size: int64(len(want))}.ReadAt(want, 0)
	if !bytes.Equal(got, want) {
		t.Fatal("the received file differs from the generated data")
	}
}

// waitFor waits until re matches the output and returns its first group.
func waitFor(t *testing.T, b *syncBuffer, re *regexp.Regexp) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m[1]
		}
	}
	t.Fatalf("no %v in the output:\n%s", re, b.String())
	return ""
}

// lyingSource hands the workers different bytes from those it hashes:
// the first read at offset 0 is corrupted, the next are not.
type lyingSource struct {
	genSource
	reads atomic.Int32
}

func (l *lyingSource) ReadAt(p []byte, off int64) (int, error) {
	n, err := l.genSource.ReadAt(p, off)
	if off == 0 && l.reads.Add(1) == 1 {
		p[0] ^= 0xff
	}
	return n, err
}

// TestMismatch checks that both ends fail, and no output file is left,
// when the checksums differ.
func TestMismatch(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	opts := []rdma.Option{rdma.WithProvider("soft"), rdma.WithMaxMessage(maxMsg)}
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var log syncBuffer
	none := progressTo(nil, true, false)
	r := &receiver{out: out, window: 1 << 20, log: &log, progress: none}
	s := &sender{src: &lyingSource{genSource: genSource{size: 3 << 20}}, chunk: 1 << 20, jobs: 2, log: &log, progress: none}
	var g errgroup.Group
	var rerr, serr error
	g.Go(func() error { rerr = r.run(ctx, ln); return nil })
	g.Go(func() error { serr = s.run(ctx, ln.Addr().String(), opts); return nil })
	g.Wait()
	if !errors.Is(rerr, errMismatch) || !errors.Is(serr, errMismatch) {
		t.Fatalf("receiver: %v; sender: %v\n%s", rerr, serr, log.String())
	}
	if !strings.Contains(log.String(), "checksum MISMATCH") {
		t.Errorf("no mismatch reported:\n%s", log.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("output written despite the mismatch: %v", err)
	}
	if _, err := os.Stat(out + ".part"); !os.IsNotExist(err) {
		t.Errorf("the .part file is left: %v", err)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-self"},
		{"-self", "-gen", "1MiB", "-i", "x"},
		{"-l", ":0", "-addr", "x:1"},
		{"-l", ":0", "-gen", "1MiB"},
		{"-self", "-gen", "lots"},
		{"-self", "-gen", "1MiB", "-j", "0"},
		{"-self", "-gen", "1MiB", "-chunk", "10"},
		{"-self", "-gen", "1MiB", "-poll", "sometimes"},
		{"-self", "-gen", "1MiB", "-sum", "md5"},
		{"-self", "-gen", "1MiB", "-provider", "magic"},
		{"-addr", "x:1", "-gen", "1MiB", "-o", "out"},
		{"-self", "-gen", "1MiB", "extra"},
	} {
		code, _, errs := runCmd(t, args...)
		if code != 2 || !strings.Contains(errs, "usage:") {
			t.Errorf("%q: exit code %d, want 2 with usage; stderr:\n%s", args, code, errs)
		}
	}
	// A run that fails is 1, not 2.
	if code, _, errs := runCmd(t, "-self", "-i", filepath.Join(t.TempDir(), "missing"), "-provider", "soft"); code != 1 {
		t.Errorf("missing input: exit code %d, want 1; stderr:\n%s", code, errs)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64KiB": 64 << 10, "64k": 64 << 10, "1MiB": 1 << 20, "8M": 8 << 20,
		"1.5GiB": 3 << 29, "2G": 2 << 30, "1MB": 1e6, "1 TiB": 1 << 40, "512B": 512,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1XB", "1e30"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
}

func TestLayout(t *testing.T) {
	l := planLayout(10<<20+1, 1<<20, 4<<20)
	if l.slots != 2 || l.slotSize != 2<<20 || l.windows() != 6 || l.chunks() != 11 {
		t.Fatalf("layout %+v: %d windows, %d chunks", l, l.windows(), l.chunks())
	}
	// The last chunk is one byte, in window 5, slot 1, at the slot's start.
	w, off, at, n := l.chunkAt(10)
	if w != 5 || off != 10<<20 || at != 2<<20 || n != 1 {
		t.Errorf("chunk 10: window %d, offset %d, at %d, %d bytes", w, off, at, n)
	}
	if l := planLayout(3<<20, 1<<20, 64<<20); l.slots != 1 || l.slotSize != 3<<20 {
		t.Errorf("small data: %+v", l)
	}
}
