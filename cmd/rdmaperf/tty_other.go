//go:build !linux

package main

import "os"

// isTerminal reports whether f is a character device, which is as close
// as the standard library gets without an ioctl.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
