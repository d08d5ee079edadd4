package rdma

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Rule: the Access bits are the verbs access flags (Expose registers
// with them, RequestRegion sends them on the wire) and print as they do.
func TestAccessIsVerbs(t *testing.T) {
	assert.Equal(t, verbs.AccessRemoteRead, verbs.Access(RemoteRead))
	assert.Equal(t, verbs.AccessRemoteWrite, verbs.Access(RemoteWrite))
	assert.Equal(t, verbs.AccessRemoteAtomic, verbs.Access(RemoteAtomic))
	for _, a := range []Access{0, RemoteRead, RemoteWrite | RemoteRead, RemoteRead | RemoteWrite | RemoteAtomic, 1, 1 << 9} {
		assert.Equal(t, verbs.Access(a).String(), a.String(), "%#x", uint32(a))
	}
	assert.Equal(t, "REMOTE_WRITE|REMOTE_READ", (RemoteRead | RemoteWrite).String())
}
