package rdma

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
// statuses by which a dead peer shows itself are ErrPeerClosed, naming
// the peer and keeping the *CompletionError; an error that is ours to
// explain is not. CI once saw a killed rxe peer answer with REM_OP_ERR,
// which was then reported as a plain remote error.
func TestCompletionErrClass(t *testing.T) {
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7471}
	for _, tc := range []struct {
		status   verbs.WCStatus
		peerGone bool
	}{
		{verbs.WCRetryExcErr, true},
		{verbs.WCRemOpErr, true},
		{verbs.WCRemAbortErr, true},
		{verbs.WCWRFlushErr, true}, // no cause recorded: the QP went down under us
		{verbs.WCRemAccessErr, false},
		{verbs.WCRemInvReqErr, false},
		{verbs.WCLocProtErr, false},
	} {
		c := &Conn{remote: remote}
		err := c.completionErr(&verbs.WorkCompletion{Status: tc.status, Opcode: verbs.WCSend, WRID: 9})
		assert.Equal(t, tc.peerGone, errors.Is(err, ErrPeerClosed), "%v: %v", tc.status, err)
		assert.True(t, strings.Contains(err.Error(), remote.String()), "%v: %v does not name the peer", tc.status, err)
		var ce *CompletionError
		require.True(t, errors.As(err, &ce), "%v: %v", tc.status, err)
		assert.Equal(t, tc.status.String(), ce.Status)
	}
}
