//go:build rdmaheaders && linux && cgo

package abicheck

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestABIMatchesHeaders checks every size, offset and constant of
// list.h: abi.h must agree with the installed rdma-core headers.
func TestABIMatchesHeaders(t *testing.T) {
	real, ours := Real(), Ours()
	require.Len(t, ours, len(real))
	require.NotEmpty(t, real)
	for i := range real {
		require.Equal(t, real[i].Name, ours[i].Name)
		assert.Equal(t, real[i].Value, ours[i].Value, "%s: rdma-core's headers say %d, abi.h %d",
			real[i].Name, real[i].Value, ours[i].Value)
	}
}

// TestListCoversABI checks that list.h names every complete type and
// every constant abi.h declares, so a declaration added to abi.h is
// checked too.
func TestListCoversABI(t *testing.T) {
	abi, err := os.ReadFile("../abi.h")
	require.NoError(t, err)
	list, err := os.ReadFile("list.h")
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`(?m)^(struct|union) (\w+) \{$`).FindAllStringSubmatch(string(abi), -1) {
		if m[2] == "verbs_context" {
			assert.Contains(t, string(list), "E(verbs_context, query_port)")
			continue
		}
		assert.Contains(t, string(list), "S("+m[1]+" "+m[2]+", "+m[2]+")", "list.h misses the size of %s %s", m[1], m[2])
	}
	for _, m := range regexp.MustCompile(`(?m)^\t((?:IBV|RDMA)_\w+) = `).FindAllStringSubmatch(string(abi), -1) {
		assert.True(t, strings.Contains(string(list), "C("+m[1]+")"), "list.h misses the constant %s", m[1])
	}
}
