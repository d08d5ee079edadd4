package rdma_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/verbs"
	"github.com/go-rdma/rdma/rdmatest"
)

// TestCompletionStatusNames: the exported statuses are libibverbs', one
// for one: each has its name, and the one past them has none.
func TestCompletionStatusNames(t *testing.T) {
	for s := range rdma.CompletionStatuses {
		assert.Equal(t, verbs.WCStatus(s).String(), s.String())
		assert.NotContains(t, s.String(), "WCStatus(")
	}
	assert.Equal(t, "REM_ACCESS_ERR", rdma.StatusRemAccessErr.String())
	assert.True(t, strings.HasPrefix(rdma.CompletionStatuses.String(), "WCStatus("), "a status without a name: the table is longer than the constants")
}

// TestFailuresByStatus: a remote access error is counted under its
// status on the side whose operation failed, send-side only.
func TestFailuresByStatus(t *testing.T) { eachProvider(t, testFailuresByStatus) }

func testFailuresByStatus(t *testing.T, opts []rdma.Option) {
	c, s := rdmatest.Pair(t, opts...)
	ctx := t.Context()
	region := reg2(t, ctx, s, c)
	region.RKey ^= 0x5a5a5a5a
	src, err := c.Alloc(64)
	require.NoError(t, err)
	defer src.Release()
	require.ErrorIs(t, c.Write(src, region).Wait(ctx), rdma.ErrRemoteAccess)

	cs := c.Stats()
	assert.Equal(t, uint64(1), cs.SendFailures[rdma.StatusRemAccessErr])
	assert.GreaterOrEqual(t, cs.Failed, uint64(1))
	var sum uint64
	for _, n := range cs.SendFailures {
		sum += n
	}
	assert.Equal(t, cs.Failed, sum, "Failed is the sum of SendFailures")
	assert.Zero(t, cs.SendFailures[rdma.StatusSuccess])
	assert.Zero(t, cs.RecvFailures[rdma.StatusRemAccessErr], "a send-side failure")
	// The failure moved the QP to ERR, whose beacon (a WR marking the
	// end of its completions) flushes: that is no failed receive.
	<-c.Done()
	assert.Zero(t, c.Stats().RecvFailed, "no receive failed: the beacon's flush is none")
}

// TestRecvFailureCounted: a failed receive completion is counted, under
// its status, receive-side.
func TestRecvFailureCounted(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	r := s.Recv()
	require.NoError(t, rdma.FailRecv(s, verbs.WCLocLenErr))
	var ce *rdma.CompletionError
	require.ErrorAs(t, r.Wait(t.Context()), &ce)
	assert.Equal(t, "LOC_LEN_ERR", ce.Status)

	ss := s.Stats()
	assert.Equal(t, uint64(1), ss.RecvFailed)
	assert.Equal(t, uint64(1), ss.RecvFailures[rdma.StatusLocLenErr])
	assert.Zero(t, ss.Failed, "no send failed")
	assert.Zero(t, c.Stats().RecvFailed, "the peer's receives did not fail")
}
