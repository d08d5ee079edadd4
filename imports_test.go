package rdma_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Rule: only internal/ibv uses cgo, so everything else builds with
// CGO_ENABLED=0 and cgo stays behind the verbs provider. golangci-lint's
// depguard (.golangci.yml) guards who imports internal/ibv but cannot
// see import "C" (it reads the files cgo has already rewritten), so this
// test is what enforces the cgo rule, and needs nothing but go.
func TestOnlyIBVUsesCgo(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the packages with (the VM runs test binaries only)")
	}
	cmd := exec.Command(goTool, "list", "-f", "{{.ImportPath}} {{join .CgoFiles \",\"}}", "./...")
	// CgoFiles is empty under CGO_ENABLED=0: list as a cgo build would.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderrOf(err))
	const ibv = "github.com/go-rdma/rdma/internal/ibv"
	sawIBV := false
	for line := range strings.Lines(string(out)) {
		pkg, files, _ := strings.Cut(strings.TrimSpace(line), " ")
		if files == "" {
			continue
		}
		if pkg == ibv {
			sawIBV = true
			continue
		}
		t.Errorf("%s has cgo files (%s): only %s may import \"C\"", pkg, files, ibv)
	}
	// Guards the check itself: a listing that saw no cgo at all proves nothing.
	require.True(t, sawIBV, "go list found no cgo files in %s:\n%s", ibv, out)
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}
