package sysfs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// readFile returns the trimmed contents of a sysfs attribute, or "" when
// it cannot be read, with three system calls (open, read, close) and no
// os.File. A RoCE port lists hundreds of GID entries (rxe: 1,024 files a
// port), and os.ReadFile sets each file up for the poller (fcntl,
// epoll_ctl), stats it and reads twice: the first Dial of a process read
// over 3,000 of them, with seven calls and a kilobyte of garbage each.
func readFile(path string) string {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	for errors.Is(err, unix.EINTR) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return ""
	}
	// An attribute is a page at most and comes whole from one read; the
	// ones read here are a few dozen bytes.
	var buf [256]byte
	n, err := unix.Read(fd, buf[:])
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Read(fd, buf[:])
	}
	unix.Close(fd)
	switch {
	case err != nil || n < 0:
		return ""
	case n == len(buf):
		return readFileWhole(path) // longer than expected: read it all
	}
	return trim(buf[:n])
}
