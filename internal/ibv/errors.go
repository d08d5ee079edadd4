//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/go-rdma/rdma/internal/verbs"
)

// opError is an errno from libibverbs, matched by errors.Is against both
// the errno and the verbs sentinel it means.
type opError struct {
	op    string
	errno syscall.Errno
	kind  error
}

func (e *opError) Error() string {
	if e.kind != nil {
		return fmt.Sprintf("ibv: %s: %v (%v)", e.op, e.kind, e.errno)
	}
	return fmt.Sprintf("ibv: %s: %v", e.op, e.errno)
}

func (e *opError) Unwrap() []error {
	if e.kind != nil {
		return []error{e.errno, e.kind}
	}
	return []error{e.errno}
}

// errnoErr wraps an errno returned (or left in errno) by libibverbs. The
// errno must be positive: syscall.Errno is unsigned, so a C function's
// negative return (-errno, or -1 with errno set) is turned into an errno
// where it is called (see cq.PollSpin and devContext.Close).
func errnoErr(op string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) || errno == 0 {
		errno = syscall.EIO
	}
	e := &opError{op: op, errno: errno}
	switch errno {
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		e.kind = verbs.ErrNotSupported
	case syscall.EINVAL:
		e.kind = verbs.ErrInvalid
	case syscall.EBUSY:
		e.kind = verbs.ErrBusy
	case syscall.ENODEV, syscall.ENXIO:
		e.kind = verbs.ErrNoDevice
	}
	return e
}

// callErr is the error of a C call that failed: the errno it left, or
// EIO when it left none, so that a failed call never returns nil.
func callErr(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}

// rcErr is the error of a C call that returns 0 or an errno: nil, or
// the errno.
func rcErr(rc int32) error {
	if rc == 0 {
		return nil
	}
	return syscall.Errno(rc)
}

// memlockError explains a registration that hit RLIMIT_MEMLOCK.
func memlockError(n int, err error) error {
	var lim syscall.Rlimit
	limit := "unknown"
	if syscall.Getrlimit(8 /* RLIMIT_MEMLOCK */, &lim) == nil {
		if lim.Cur == ^uint64(0) {
			limit = "unlimited"
		} else {
			limit = fmt.Sprintf("%d KiB", lim.Cur/1024)
		}
	}
	who := ""
	if os.Geteuid() != 0 {
		who = " as a non-root user"
	}
	return fmt.Errorf("ibv: register %d bytes: %w: RLIMIT_MEMLOCK is %s%s; raise it with `ulimit -l unlimited` (or LimitMEMLOCK= in a systemd unit) (%v)",
		n, verbs.ErrMemlock, limit, who, err)
}
