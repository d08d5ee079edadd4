package verbs

import (
	"errors"
	"fmt"
	"net"
)

var (
	// ErrNotSupported: the provider, build or device cannot do this.
	ErrNotSupported = errors.New("not supported")
	// ErrClosed: the object was closed. It reads "closed", for callers
	// to say which object and where, and wraps net.ErrClosed so that
	// callers of the upper layers can test one error.
	ErrClosed error = closedError{}
	// ErrBusy: a parent still has live children; close them first.
	ErrBusy = errors.New("object has live children")
	// ErrInvalid: an argument breaks a rule stated in the call's doc.
	ErrInvalid = errors.New("invalid argument")
	// ErrNoDevice: no device of that name, or none at all.
	ErrNoDevice = errors.New("no such RDMA device")
	// ErrQPState: the queue pair is not in a state that allows the call.
	ErrQPState = errors.New("queue pair in wrong state")
	// ErrQueueFull: the work queue has no room for another WR.
	ErrQueueFull = errors.New("work queue full")
	// ErrMemlock: registration hit RLIMIT_MEMLOCK.
	ErrMemlock = errors.New("locked-memory limit exceeded")

	// Completion sentinels. A *WCError matches the one for its status.
	ErrRemoteAccess      = errors.New("remote access error")
	ErrRemoteOp          = errors.New("remote operation error")
	ErrRemoteInvalid     = errors.New("remote invalid request")
	ErrRNRRetryExceeded  = errors.New("RNR retry count exceeded")
	ErrRetryExceeded     = errors.New("transport retry count exceeded")
	ErrFlushed           = errors.New("work request flushed")
	ErrLocalLength       = errors.New("local length error")
	ErrLocalProtection   = errors.New("local protection error")
	ErrLocalQPOperation  = errors.New("local QP operation error")
	ErrCompletionFailure = errors.New("work completion failed")
)

// WCError is a failed work completion. It carries exactly the fields a
// failed completion has valid.
type WCError struct {
	Status    WCStatus
	Opcode    WCOpcode // as reported; not valid on every provider for failures
	WRID      uint64
	VendorErr uint32
	QPN       uint32
}

func (e *WCError) Error() string {
	return fmt.Sprintf("work completion %s (wr_id %d, qp %#x, opcode %s, vendor_err %#x)", e.Status, e.WRID, e.QPN, e.Opcode, e.VendorErr)
}

// Is matches the sentinel for e's status, and ErrCompletionFailure for all.
func (e *WCError) Is(target error) bool {
	if target == ErrCompletionFailure {
		return true
	}
	return target != nil && target == statusSentinel(e.Status)
}

func statusSentinel(s WCStatus) error {
	switch s {
	case WCRemAccessErr:
		return ErrRemoteAccess
	case WCRemOpErr:
		return ErrRemoteOp
	case WCRemInvReqErr:
		return ErrRemoteInvalid
	case WCRNRRetryExcErr:
		return ErrRNRRetryExceeded
	case WCRetryExcErr:
		return ErrRetryExceeded
	case WCWRFlushErr:
		return ErrFlushed
	case WCLocLenErr:
		return ErrLocalLength
	case WCLocProtErr:
		return ErrLocalProtection
	case WCLocQPOpErr:
		return ErrLocalQPOperation
	}
	return nil
}

// PostError is a failed PostSend or PostRecv. The first Posted WRs of the
// chain were accepted and will complete; WR number Posted failed; the rest
// were not posted.
type PostError struct {
	Op     string // "post_send" or "post_recv"
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("%s: WR %d of the chain rejected (%d posted): %v", e.Op, e.Posted, e.Posted, e.Err)
}

func (e *PostError) Unwrap() error { return e.Err }

// closedError is ErrClosed: its text is one word, unlike net.ErrClosed's
// "use of closed network connection", which names no object.
type closedError struct{}

func (closedError) Error() string { return "closed" }
func (closedError) Unwrap() error { return net.ErrClosed }
