//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// fdWaiter waits for a libibverbs event fd (completion channel or async
// events) through Go's netpoller: the fd is made non-blocking and a dup of
// it is handed to os.NewFile, so a waiting goroutine parks without holding
// an OS thread. libibverbs keeps reading the original fd; both share one
// open file description, so readiness is the same.
type fdWaiter struct {
	f  *os.File
	rc syscall.RawConn

	waitMu sync.Mutex // one waiter at a time: deadlines are per file
	// Under waitMu: the current wait's try and its error, and the read
	// callback, made once (a closure per wait would allocate).
	try    func() (bool, error)
	tryErr error
	ready  func(uintptr) bool
	// The context of the last wait and its cancellation callback. A
	// completion poller waits with the same context until a Kick cancels
	// it, so registering once per context rather than once per wait
	// keeps parking free of allocations.
	regCtx  context.Context
	regStop func() bool

	mu      sync.Mutex // guards waiting against the cancellation callback
	waiting bool

	closed atomic.Bool
}

func newFDWaiter(fd int, name string) (*fdWaiter, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, errnoErr("set O_NONBLOCK on "+name, err)
	}
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("ibv: dup %s fd: %w", name, err)
	}
	syscall.CloseOnExec(nfd)
	if err := syscall.SetNonblock(nfd, true); err != nil {
		syscall.Close(nfd)
		return nil, fmt.Errorf("ibv: %s: %w", name, err)
	}
	f := os.NewFile(uintptr(nfd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ibv: %s: %w", name, err)
	}
	w := &fdWaiter{f: f, rc: rc}
	w.ready = func(uintptr) bool {
		done, err := w.try()
		w.tryErr = err
		return done
	}
	return w, nil
}

var longAgo = time.Unix(1, 0)

// wait calls try each time the fd is readable until try reports done. It
// returns ctx's error when ctx ends first and an error wrapping
// verbs.ErrClosed once close has been called.
func (w *fdWaiter) wait(ctx context.Context, try func() (done bool, err error)) error {
	w.waitMu.Lock()
	defer w.waitMu.Unlock()
	if w.closed.Load() {
		return verbs.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ctx != w.regCtx {
		if w.regStop != nil {
			w.regStop()
		}
		w.regCtx, w.regStop = ctx, context.AfterFunc(ctx, w.cancel)
	}
	w.try, w.tryErr = try, nil
	defer func() { w.try = nil }()
	for {
		w.mu.Lock()
		// A cancellation that came after the check above found no
		// wait to end; ctx says so now (it is cancelled before its
		// callbacks run).
		if err := ctx.Err(); err != nil {
			w.mu.Unlock()
			return err
		}
		w.waiting = true
		w.f.SetReadDeadline(time.Time{})
		w.mu.Unlock()
		err := w.rc.Read(w.ready)
		w.mu.Lock()
		w.waiting = false
		w.mu.Unlock()
		switch {
		case err == nil:
			return w.tryErr
		case w.closed.Load() || errors.Is(err, os.ErrClosed):
			return verbs.ErrClosed
		case errors.Is(err, os.ErrDeadlineExceeded):
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// The callback of a context this waiter no longer waits
			// on was already running when it was replaced: wait on.
			continue
		}
		return err
	}
}

// cancel ends the wait in progress, if any: it runs when the context of
// the last wait ends.
func (w *fdWaiter) cancel() {
	w.mu.Lock()
	if w.waiting {
		w.f.SetReadDeadline(longAgo)
	}
	w.mu.Unlock()
}

// close wakes a waiter (it returns ErrClosed) and closes the dup'd fd. The
// original fd belongs to libibverbs.
func (w *fdWaiter) close() {
	w.closed.Store(true)
	w.f.Close()
	w.waitMu.Lock() // a wait in progress has returned
	if w.regStop != nil {
		w.regStop()
		w.regCtx, w.regStop = nil, nil
	}
	w.waitMu.Unlock()
}
