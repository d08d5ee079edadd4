package main

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWithoutRDMACore: rdmacat does not link rdma-core (its DT_NEEDED
// names neither libibverbs nor librdmacm), and where the libraries
// cannot be loaded ($GO_RDMA_LIBIBVERBS and $GO_RDMA_LIBRDMACM name
// missing files) the same binary pipes a file on auto, which has no
// device then and falls back to TCP.
func TestWithoutRDMACore(t *testing.T) {
	bin := build(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libibverbs") || strings.HasPrefix(l, "librdmacm") {
			t.Errorf("rdmacat needs %s (DT_NEEDED %v)", l, libs)
		}
	}

	t.Setenv("GO_RDMA_LIBIBVERBS", "/nonexistent/libibverbs.so.1")
	t.Setenv("GO_RDMA_LIBRDMACM", "/nonexistent/librdmacm.so.1")
	t.Setenv("RDMA_PROVIDER", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, data := randomFile(t, 1<<20)
	out := filepath.Join(t.TempDir(), "out")
	recv, addr := listen(t, ctx, bin+" -l -v -provider auto 127.0.0.1:0 > "+out+" < /dev/null")
	send := exec.CommandContext(ctx, bin, "-v", "-provider", "auto", addr)
	send.Stdin = bytes.NewReader(data)
	var sendErr bytes.Buffer
	send.Stderr = &sendErr
	if err := send.Run(); err != nil {
		t.Fatalf("sender: %v\n%s", err, sendErr.String())
	}
	if recvErr, err := recv(); err != nil {
		t.Fatalf("receiver: %v\n%s", err, recvErr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("received %d bytes of %s, sent %d: not the same", len(got), in, len(data))
	}
	// No usable device: the stream fell back to TCP (with no rdma-core
	// it would have taken soft before the fallback).
	if !strings.Contains(sendErr.String(), "(TCP fallback") {
		t.Errorf("auto without rdma-core did not fall back to TCP:\n%s", sendErr.String())
	}
}
