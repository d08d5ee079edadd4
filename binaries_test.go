package rdma_test

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxBinaryFile is the largest non-text file the repository may hold (the
// plots under test/perf/results are 8-26 KB). An executable is refused at
// any size.
const maxBinaryFile = 256 << 10

// trackedFiles lists the files git tracks in this checkout, or skips the
// test where the sources are not a git checkout (the copy the VM stage
// runs the tests in, a module download).
func trackedFiles(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: cannot list the tracked files")
	}
	if exec.Command("git", "rev-parse", "--is-inside-work-tree").Run() != nil {
		t.Skip("not a git checkout")
	}
	out, err := exec.Command("git", "ls-files", "-z").Output()
	require.NoError(t, err, "git ls-files")
	files := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	require.Greater(t, len(files), 100, "git ls-files listed too few files")
	return files
}

// executableMagic are the first bytes of the executable and object formats
// a Go build writes: ELF, Mach-O (both byte orders, 32 and 64 bit, fat),
// PE (Windows) and ar archives (go build -buildmode=archive, .a). "MZ" and
// "!<arch>" also start text files, so they count only in a binary one.
var executableMagic = []struct {
	magic        []byte
	onlyInBinary bool
}{
	{[]byte("\x7fELF"), false},
	{[]byte{0xfe, 0xed, 0xfa, 0xce}, false}, {[]byte{0xfe, 0xed, 0xfa, 0xcf}, false},
	{[]byte{0xce, 0xfa, 0xed, 0xfe}, false}, {[]byte{0xcf, 0xfa, 0xed, 0xfe}, false},
	{[]byte{0xca, 0xfe, 0xba, 0xbe}, false},
	{[]byte("MZ"), true},
	{[]byte("!<arch>\n"), true},
}

// classify says whether head, a file's first bytes, looks binary (a NUL
// byte, git's own test) and whether it is an executable or object file.
func classify(head []byte) (binary, executable bool) {
	binary = bytes.IndexByte(head, 0) >= 0
	for _, m := range executableMagic {
		if bytes.HasPrefix(head, m.magic) && (binary || !m.onlyInBinary) {
			return binary, true
		}
	}
	return binary, false
}

// Rule: the repository holds sources, not build outputs. A 12.5 MB binary
// (cmd/examples/raftkv/raftkv) was committed once; every clone carries it
// in its history.
func TestNoCommittedBinaries(t *testing.T) {
	for _, f := range trackedFiles(t) {
		fi, err := os.Lstat(f)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		require.NoError(t, err)
		if !fi.Mode().IsRegular() {
			continue
		}
		head, err := readHead(f, 8<<10)
		require.NoError(t, err)
		binary, executable := classify(head)
		switch {
		case executable:
			t.Errorf("%s (%d bytes) is an executable or object file: build outputs are not committed (git rm --cached it; .gitignore)", f, fi.Size())
		case binary && fi.Size() > maxBinaryFile:
			t.Errorf("%s is a binary file of %d bytes (over %d): is it a build output?", f, fi.Size(), maxBinaryFile)
		}
	}
}

func readHead(name string, n int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	head := make([]byte, n)
	m, err := io.ReadFull(f, head)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	return head[:m], err
}

func TestClassifyBinaries(t *testing.T) {
	for _, c := range []struct {
		name               string
		head               []byte
		binary, executable bool
	}{
		{"ELF", []byte("\x7fELF\x02\x01\x01\x00\x00"), true, true},
		{"Mach-O 64", []byte{0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1}, true, true},
		{"PE", []byte("MZ\x90\x00\x03\x00"), true, true},
		{"ar", []byte("!<arch>\n__.PKGDEF  0 \x00"), true, true},
		{"Go source", []byte("package rdma\n"), false, false},
		{"text starting with MZ", []byte("MZ is a name\n"), false, false},
		{"PNG", []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), true, false},
	} {
		binary, executable := classify(c.head)
		require.Equal(t, c.binary, binary, c.name)
		require.Equal(t, c.executable, executable, c.name)
	}
}

// Rule: what `go build` writes for a command (a binary named after its
// directory, there or in the root) and `go test -c` writes (PKG.test) is
// ignored, so
// that `git add .` after a build cannot commit it.
func TestBuildOutputsIgnored(t *testing.T) {
	trackedFiles(t) // skips where this is not a git checkout
	var outputs []string
	err := filepath.WalkDir("cmd", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		head, err := readHead(path, 4<<10)
		if err != nil {
			return err
		}
		if bytes.Contains(head, []byte("\npackage main\n")) || bytes.HasPrefix(head, []byte("package main\n")) {
			dir := filepath.Dir(path)
			// go build in dir, and go build ./dir in the root.
			outputs = append(outputs, filepath.Join(dir, filepath.Base(dir)), filepath.Base(dir))
		}
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, len(outputs), 5, "no main package found under cmd")
	outputs = append(outputs, "rdma.test", "stream/stream.test", "cmd/rdmacat/rdmacat.test")
	seen := map[string]bool{}
	for _, out := range outputs {
		if seen[out] {
			continue
		}
		seen[out] = true
		// --no-index: whether the patterns cover the path, tracked or not
		// (TestNoCommittedBinaries catches a tracked one).
		if err := exec.Command("git", "check-ignore", "-q", "--no-index", out).Run(); err != nil {
			t.Errorf("%s, a build output, is not in .gitignore (git check-ignore: %v)", out, err)
		}
	}
}
