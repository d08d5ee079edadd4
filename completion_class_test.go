package rdma

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/ibv"
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
		c := &conn{remote: remote}
		c.life.Init(remote)
		if tc.cm {
			c.cm = &ibv.CMID{}
		}
		err := c.completionErr(&verbs.WorkCompletion{Status: tc.status, Opcode: verbs.WCSend, WRID: 9})
		for _, sentinel := range []error{ErrPeerLost, ErrPeerClosed} {
			assert.Equal(t, tc.want == sentinel, errors.Is(err, sentinel), "%v (cm %v): %v is %v", tc.status, tc.cm, err, sentinel)
		}
		assert.True(t, strings.Contains(err.Error(), remote.String()), "%v: %v does not name the peer", tc.status, err)
		var ce *CompletionError
		require.True(t, errors.As(err, &ce), "%v: %v", tc.status, err)
		assert.Equal(t, tc.status.String(), ce.Status)
	}
}

// TestCompletionErrAfterPeerClose: once the peer's orderly close was
// heard, every failed completion is the close's one error, with no
// status in it, whatever the status.
func TestCompletionErrAfterPeerClose(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7471}
	for _, st := range []verbs.WCStatus{verbs.WCWRFlushErr, verbs.WCRetryExcErr, verbs.WCRemOpErr, verbs.WCRemAccessErr} {
		c := &conn{remote: remote}
		c.life.Init(remote)
		c.life.HearClose()
		err := c.completionErr(&verbs.WorkCompletion{Status: st, Opcode: verbs.WCRecv, WRID: 9})
		assert.Equal(t, "rdma: peer 127.0.0.1:7471: peer closed the connection", err.Error(), "%v", st)
		assert.ErrorIs(t, err, ErrPeerClosed)
		assert.NotErrorIs(t, err, ErrPeerLost)
	}
}
