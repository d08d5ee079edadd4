//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"fmt"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// The libraries are loaded at their first use rather than linked, so
// that one binary runs with and without rdma-core installed: loader.go
// loads them for the cgo build (loader.h), loader_purego.go for the
// purego one.
//
// A failed load is kept: the process does not retry, and every caller
// gets the same error.
var (
	loadVerbs = sync.OnceValue(func() error { return loadVerbsFrom(libPath(EnvLibibverbs, SonameLibibverbs)) })
	loadCM    = sync.OnceValue(func() error {
		// librdmacm needs libibverbs, and must find the copy this
		// package loaded (which $GO_RDMA_LIBIBVERBS may have chosen).
		if err := loadVerbs(); err != nil {
			return err
		}
		return loadCMFrom(libPath(EnvLibrdmacm, SonameLibrdmacm))
	})
)

// Available reports whether libibverbs is loaded, loading it on the
// first call: nil, or an error wrapping verbs.ErrNotSupported that says
// why it could not be. Without it the provider lists the devices of
// sysfs as unusable and Open fails.
func Available() error { return loadVerbs() }

// CMAvailable is Available for librdmacm (and libibverbs, which it
// needs). Without it CMListen and CMDial fail; the rest works.
func CMAvailable() error { return loadCM() }

// loadFailed explains a failed load of lib from path, with the loader's
// reason (dlerror's text, which names the file as a rule, but once in
// CI was empty).
func loadFailed(lib, path, env, reason string) error {
	if reason == "" {
		reason = "no reason given by the dynamic loader"
	}
	return fmt.Errorf("ibv: %w: %s could not be loaded from %s: %s (install rdma-core's %s, or name the file in $%s)",
		verbs.ErrNotSupported, lib, path, reason, lib, env)
}
