package rdma

import (
	"context"
	"errors"
	"os"
)

// timeoutError is a failure because a bound ran out. It is a net.Error
// whose Timeout() is true, so that a *net.OpError holding it reports a
// timeout as net's own errors do (OpError.Timeout looks only at the error
// it holds directly), and it matches what it wraps
// (os.ErrDeadlineExceeded or context.DeadlineExceeded, and the cause).
type timeoutError struct{ err error }

func (e *timeoutError) Error() string   { return e.err.Error() }
func (e *timeoutError) Unwrap() error   { return e.err }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

// asTimeout makes err, when a deadline or a context's deadline ended it,
// a net.Error with Timeout() true; other errors, a cancelled context's
// among them, it returns as they are.
func asTimeout(err error) error {
	if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
		return err
	}
	if errors.Is(err, context.Canceled) {
		// A cancelled handshake also fails its reads by a deadline
		// (bound): that is no timeout.
		return err
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return &timeoutError{err: err}
	}
	return err
}
