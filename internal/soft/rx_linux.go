package soft

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// scatterReader reads a TCP connection with readv(2), through the Go
// runtime's network poller (deadlines apply).
type scatterReader struct {
	rc    syscall.RawConn
	iov   [2]syscall.Iovec
	niov  uintptr
	yield bool // return errAgain rather than wait
	n     int
	errno syscall.Errno
	again bool
	fn    func(fd uintptr) bool
}

func newScatterReader(nc net.Conn) *scatterReader {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &scatterReader{rc: rc}
	s.fn = s.do
	return s
}

func (s *scatterReader) do(fd uintptr) bool {
	for {
		n, _, e := syscall.Syscall(syscall.SYS_READV, fd, uintptr(unsafe.Pointer(&s.iov[0])), s.niov)
		switch e {
		case 0:
			s.n, s.errno = int(n), 0
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.yield {
				s.again = true
				return true
			}
			return false
		default:
			s.n, s.errno = 0, e
			return true
		}
	}
}

// readv reads into a, then b (either may be empty, not both) and returns
// the bytes read, counted from the start of a. With yield, a read that
// would wait returns errAgain instead.
func (s *scatterReader) readv(a, b []byte, yield bool) (int, error) {
	s.niov = 0
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			s.iov[s.niov].Base = &p[0]
			s.iov[s.niov].SetLen(len(p))
			s.niov++
		}
	}
	s.yield, s.again = yield, false
	err := s.rc.Read(s.fn)
	s.iov = [2]syscall.Iovec{}
	switch {
	case err != nil:
		return 0, err
	case s.again:
		return 0, errAgain
	case s.errno != 0:
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: s.errno}
	case s.n == 0:
		return 0, io.EOF
	}
	return s.n, nil
}

// unread reports whether bytes from the peer wait in the socket, not
// read yet: the peer spoke, and this process has not listened (its
// reader is starved of CPU, not its peer silent).
func unread(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) {
		v, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		if v != 0 || errno != 0 {
			n = 0
		}
	})
	return n > 0
}
