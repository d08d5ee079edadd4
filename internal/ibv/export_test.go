//go:build linux && (cgo || amd64 || arm64)

package ibv

// LoadVerbsFrom and LoadCMFrom run the loaders on a path of the test's
// choosing, outside the once of the real load. Only failing loads may be
// tried: those change nothing.
var (
	LoadVerbsFrom = loadVerbsFrom
	LoadCMFrom    = loadCMFrom
)
