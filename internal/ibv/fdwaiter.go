//go:build linux && cgo

package ibv

/*
#include "shim.h"
*/
import "C"

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

	mu  sync.Mutex // guards gen against late cancellation callbacks
	gen uint64

	closed atomic.Bool
}

func newFDWaiter(fd C.int, name string) (*fdWaiter, error) {
	if rc := C.gordma_set_nonblock(fd); rc != 0 {
		return nil, errnoErr("set O_NONBLOCK on "+name, syscall.Errno(rc))
	}
	nfd, err := syscall.Dup(int(fd))
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
	return &fdWaiter{f: f, rc: rc}, nil
}

var longAgo = time.Unix(1, 0)

// wait calls try each time the fd is readable until try reports done. It
// returns ctx's error when ctx ends first and an error wrapping
// verbs.ErrClosed once close has been called.
func (w *fdWaiter) wait(ctx context.Context, try func() (done bool, err error)) error {
	w.waitMu.Lock()
	defer w.waitMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	w.gen++
	gen := w.gen
	w.f.SetReadDeadline(time.Time{})
	w.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		w.mu.Lock()
		if w.gen == gen {
			w.f.SetReadDeadline(longAgo)
		}
		w.mu.Unlock()
	})
	var tryErr error
	err := w.rc.Read(func(uintptr) bool {
		done, err := try()
		tryErr = err
		return done
	})
	stop()
	w.mu.Lock()
	w.gen++ // a callback that fires from now on is stale
	w.mu.Unlock()
	switch {
	case err == nil:
		return tryErr
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return ctx.Err()
	case w.closed.Load() || errors.Is(err, os.ErrClosed):
		return verbs.ErrClosed
	}
	return err
}

// close wakes a waiter (it returns ErrClosed) and closes the dup'd fd. The
// original fd belongs to libibverbs.
func (w *fdWaiter) close() {
	w.closed.Store(true)
	w.f.Close()
}
