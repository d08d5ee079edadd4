package rc

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestCompletionErrClass pins how a failed completion is explained: the
// statuses by which a dead peer shows itself are ErrPeerLost (not
// ErrPeerClosed), naming the peer and keeping the *CompletionError; a
// flush without a recorded cause is the peer's disconnect through
// rdma_cm (ErrPeerClosed); an error that is ours to explain is neither.
// CI once saw a killed rxe peer answer with REM_OP_ERR, which was then
// reported as a plain remote error.
func TestCompletionErrClass(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7471}
	for _, tc := range []struct {
		status verbs.WCStatus
		cm     bool
		want   error // nil: ours to explain
	}{
		{verbs.WCRetryExcErr, false, ErrPeerLost},
		{verbs.WCRemOpErr, false, ErrPeerLost},
		{verbs.WCRemAbortErr, false, ErrPeerLost},
		{verbs.WCWRFlushErr, false, ErrPeerLost}, // no cause recorded: the QP went down under us
		{verbs.WCWRFlushErr, true, ErrPeerClosed},
		{verbs.WCRetryExcErr, true, ErrPeerLost},
		{verbs.WCRemAccessErr, false, nil},
		{verbs.WCRemInvReqErr, false, nil},
		{verbs.WCLocProtErr, false, nil},
	} {
		c := &Conn{Remote: remote, shell: wcShell{}}
		c.Life.Init(remote)
		if tc.cm {
			c.CM = fakeCM{}
		}
		err := c.completionErr(&verbs.WorkCompletion{Status: tc.status, Opcode: verbs.WCSend, WRID: 9})
		for _, sentinel := range []error{ErrPeerLost, ErrPeerClosed} {
			assert.Equal(t, tc.want == sentinel, errors.Is(err, sentinel), "%v (cm %v): %v is %v", tc.status, tc.cm, err, sentinel)
		}
		assert.True(t, strings.Contains(err.Error(), remote.String()), "%v: %v does not name the peer", tc.status, err)
		var ce *verbs.WCError
		require.True(t, errors.As(err, &ce), "%v: %v", tc.status, err)
		assert.Equal(t, tc.status, ce.Status)
	}
}

// TestCompletionErrAfterPeerClose: once the peer's orderly close was
// heard, every failed completion is the close's one error, with no
// status in it, whatever the status.
func TestCompletionErrAfterPeerClose(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7471}
	for _, st := range []verbs.WCStatus{verbs.WCWRFlushErr, verbs.WCRetryExcErr, verbs.WCRemOpErr, verbs.WCRemAccessErr} {
		c := &Conn{Remote: remote, shell: wcShell{}}
		c.Life.Init(remote)
		c.Life.HearClose()
		err := c.completionErr(&verbs.WorkCompletion{Status: st, Opcode: verbs.WCRecv, WRID: 9})
		assert.Equal(t, "rdma: peer 127.0.0.1:7471: peer closed the connection", err.Error(), "%v", st)
		assert.ErrorIs(t, err, ErrPeerClosed)
		assert.NotErrorIs(t, err, ErrPeerLost)
	}
}

// wcShell is a Shell whose completion errors are the verbs' own.
type wcShell struct{}

func (wcShell) Handle()       {}
func (wcShell) Connected()    {}
func (wcShell) Ended(error)   {}
func (wcShell) Retire() error { return nil }
func (wcShell) CompletionError(wc *verbs.WorkCompletion) error {
	return &verbs.WCError{Status: wc.Status, Opcode: wc.Opcode, WRID: wc.WRID, QPN: wc.QPN}
}

// fakeCM is an rdma_cm connection that does nothing.
type fakeCM struct{}

func (fakeCM) Disconnect() error { return nil }
func (fakeCM) Close() error      { return nil }
