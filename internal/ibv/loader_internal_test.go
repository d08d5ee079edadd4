//go:build linux && (cgo || amd64 || arm64)

package ibv

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/go-rdma/rdma/internal/verbs"
)

// TestLoadFailedNamesThePath: a failed load names the file it tried and
// says why, even when the dynamic loader gives no reason. In CI dlerror
// once gave an empty string, and the error named neither ("libibverbs
// could not be loaded:  (install ...").
func TestLoadFailedNamesThePath(t *testing.T) {
	for _, reason := range []string{"", "/x/libibverbs.so.1: cannot open shared object file"} {
		err := loadFailed("libibverbs", "/x/libibverbs.so.1", EnvLibibverbs, reason)
		assert.True(t, errors.Is(err, verbs.ErrNotSupported), "%v", err)
		assert.Contains(t, err.Error(), "libibverbs could not be loaded from /x/libibverbs.so.1: ")
		assert.Contains(t, err.Error(), "$"+EnvLibibverbs)
		if reason == "" {
			assert.Contains(t, err.Error(), "no reason given by the dynamic loader")
		} else {
			assert.Contains(t, err.Error(), reason)
		}
	}
}
