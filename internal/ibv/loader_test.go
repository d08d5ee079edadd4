//go:build linux && cgo

package ibv_test

import (
	"debug/elf"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
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

// Rule: where rdma-core is installed (wherever this package builds: its
// headers come with the libraries), both libraries load at run time.
func TestLoadRDMACore(t *testing.T) {
	if os.Getenv(ibv.EnvLibibverbs) != "" || os.Getenv(ibv.EnvLibrdmacm) != "" {
		t.Skipf("$%s or $%s chooses the libraries", ibv.EnvLibibverbs, ibv.EnvLibrdmacm)
	}
	if err := ibv.Available(); err != nil {
		t.Fatal(err)
	}
	if err := ibv.CMAvailable(); err != nil {
		t.Fatal(err)
	}
}

// Rule: a library that cannot be loaded, or lacks a function, gives an
// error wrapping verbs.ErrNotSupported that names the file, what is
// missing and the variable that names another file.
func TestLoadFailures(t *testing.T) {
	for _, c := range []struct {
		name string
		load func(string) error
		path string
		want []string
	}{
		{"no libibverbs", ibv.LoadVerbsFrom, "/nonexistent/libibverbs.so.1", []string{"libibverbs", "/nonexistent/libibverbs.so.1", "$" + ibv.EnvLibibverbs}},
		{"no librdmacm", ibv.LoadCMFrom, "/nonexistent/librdmacm.so.1", []string{"librdmacm", "/nonexistent/librdmacm.so.1", "$" + ibv.EnvLibrdmacm}},
		{"libibverbs without verbs", ibv.LoadVerbsFrom, "libc.so.6", []string{"has no ibv_get_device_list@IBVERBS_1.1"}},
		{"librdmacm without rdma_cm", ibv.LoadCMFrom, ibv.SonameLibibverbs, []string{"has no rdma_create_event_channel@RDMACM_1.0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.load(c.path)
			if !errors.Is(err, verbs.ErrNotSupported) {
				t.Fatalf("load %s = %v, want an error wrapping ErrNotSupported", c.path, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("load %s = %q, want it to say %q", c.path, err, w)
				}
			}
		})
	}
	// A failed load changed nothing: the process's libraries still work.
	if _, err := ibv.Provider.Devices(); err != nil {
		t.Fatal(err)
	}
}
