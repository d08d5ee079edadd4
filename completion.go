package rdma

import (
	"github.com/go-rdma/rdma/internal/verbs"
)

// CompletionError is an operation the device completed with an error:
// a failed work completion. It is in the chain of the error of the
// operation's Future, and of the errors of the connection it failed.
//
// Status is the completion's status as libibverbs names it, for example
// "REM_ACCESS_ERR" (the peer's memory refused the access: a wrong rkey,
// range or rights), "RETRY_EXC_ERR" (the transport gave up on the peer)
// or "WR_FLUSH_ERR" (the queue pair had failed before the operation ran).
// Op is the operation that was posted ("SEND", "RDMA_WRITE", "RECV",
// ...), as the library knows it, not as the device reported it (a failed
// completion's opcode is undefined on many devices). For an atomic it
// is as the device reported it. WRID is the work request's id and QPN its
// queue pair's number, for logs; VendorErr is the device's own code for
// the failure.
//
// errors.Is matches the sentinel of its status: ErrRemoteAccess,
// ErrRemoteOp, ErrRNRRetry, ErrRetryExceeded or ErrFlushed.
type CompletionError struct {
	Status    string
	Op        string
	WRID      uint64
	QPN       uint32
	VendorErr uint32

	wc verbs.WCError
}

// Error gives the status, the work request id, the queue pair, the
// opcode and the vendor error.
func (e *CompletionError) Error() string { return e.wc.Error() }

// Is matches the sentinel of e's status.
func (e *CompletionError) Is(target error) bool { return e.wc.Is(target) }

func completionError(wc *verbs.WorkCompletion) *CompletionError {
	e := &CompletionError{Status: wc.Status.String(), Op: wc.Opcode.String(), WRID: wc.WRID, QPN: wc.QPN, VendorErr: wc.VendorErr}
	e.wc = verbs.WCError{Status: wc.Status, Opcode: wc.Opcode, WRID: wc.WRID, VendorErr: wc.VendorErr, QPN: wc.QPN}
	return e
}

// CompletionStatus is a work completion's status, numbered as libibverbs
// numbers enum ibv_wc_status. It indexes ConnStats.SendFailures and
// RecvFailures; its String is the name CompletionError.Status carries.
type CompletionStatus uint8

// The completion statuses, in libibverbs' order. A status a device
// reports beyond these is counted as StatusGeneralErr.
// CompletionStatuses is their number: the length of the arrays they
// index.
const (
	StatusSuccess CompletionStatus = iota
	StatusLocLenErr
	StatusLocQPOpErr
	StatusLocEECOpErr
	StatusLocProtErr
	StatusWRFlushErr
	StatusMWBindErr
	StatusBadRespErr
	StatusLocAccessErr
	StatusRemInvReqErr
	StatusRemAccessErr
	StatusRemOpErr
	StatusRetryExcErr
	StatusRNRRetryExcErr
	StatusLocRDDViolErr
	StatusRemInvRdReqErr
	StatusRemAbortErr
	StatusInvEECNErr
	StatusInvEECStateErr
	StatusFatalErr
	StatusRespTimeoutErr
	StatusGeneralErr
	CompletionStatuses
)

// String is the status as libibverbs names it, for example
// "REM_ACCESS_ERR".
func (s CompletionStatus) String() string { return verbs.WCStatus(s).String() }
