//go:build !linux

package sysfs

// readFile returns the trimmed contents of a sysfs attribute, or "" when
// it cannot be read.
func readFile(path string) string { return readFileWhole(path) }
