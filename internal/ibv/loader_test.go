//go:build linux && cgo

package ibv_test

import (
	"debug/elf"
	"os"
	"strings"
	"testing"
)

// Rule: a binary with the verbs provider does not link rdma-core. Its
// DT_NEEDED names neither libibverbs nor librdmacm and it imports none of
// their symbols, so it starts on a machine without them (loader.h).
func TestNoLinkToRDMACore(t *testing.T) {
	f, err := elf.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	libc := false
	for _, l := range libs {
		if strings.HasPrefix(l, "libibverbs") || strings.HasPrefix(l, "librdmacm") {
			t.Errorf("the test binary needs %s (DT_NEEDED %v)", l, libs)
		}
		libc = libc || strings.HasPrefix(l, "libc.so")
	}
	if !libc {
		// Not a cgo binary: the check above would prove nothing.
		t.Fatalf("the test binary needs %v, not libc: is it built with cgo?", libs)
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "ibv_") || strings.HasPrefix(s.Name, "rdma_") ||
			strings.HasPrefix(s.Version, "IBVERBS") || strings.HasPrefix(s.Version, "RDMACM") {
			t.Errorf("the test binary imports %s@%s from %q", s.Name, s.Version, s.Library)
		}
	}
}
