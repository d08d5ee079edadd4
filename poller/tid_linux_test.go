package poller

import "syscall"

// threadID is the OS thread the caller runs on.
func threadID() int { return syscall.Gettid() }
