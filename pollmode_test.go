package rdma_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

// TestParsePollMode: each mode parses back from its name, other names
// are ErrInvalid, and WithPollMode refuses a mode that is none of them.
func TestParsePollMode(t *testing.T) {
	for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy, rdma.PollEvent} {
		got, err := rdma.ParsePollMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := rdma.ParsePollMode("spin")
	assert.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Contains(t, err.Error(), `"spin"`)
	_, err = rdma.Dial(t.Context(), "tcp", "127.0.0.1:1", rdma.WithPollMode(rdma.PollMode(9)))
	assert.ErrorIs(t, err, rdma.ErrInvalid)
	assert.Equal(t, rdma.PollAdaptive, rdma.PollMode(0), "the zero mode is the default")
}
