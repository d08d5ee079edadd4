//go:build linux && (cgo || amd64 || arm64)

package ibv_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The loader rules hold for both bindings: the cgo one (loader.go) and the
// purego one (loader_purego.go) give the same errors.

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
