//go:build !linux

package poller

// threadID is not available here; TestLockedThread skips.
func threadID() int { return -1 }
