package stream

import "testing"

// ForceHeaderMode makes the streams that t's test opens use header mode
// (ring.go) although their connections have credits, so that the mode
// rdma_cm set-ups need runs on the soft provider too.
func ForceHeaderMode(t testing.TB) {
	SetHeaderMode(true)
	t.Cleanup(func() { SetHeaderMode(false) })
}

// SetHeaderMode is ForceHeaderMode for a test's child process.
func SetHeaderMode(on bool) { forceHeaderMode.Store(on) }
