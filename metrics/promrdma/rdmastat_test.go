package promrdma_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/metrics/promrdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRdmastat: cmd/rdmastat -prom reads what this collector serves: the
// engine's line, its sampled latencies and the busiest connection's
// row. rdmastat's own tests parse an exposition written by hand; this
// keeps that one true to the collector.
func TestRdmastat(t *testing.T) {
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command that runs the test builds rdmastat")
	bin := filepath.Join(t.TempDir(), "rdmastat")
	built, err := exec.Command(goTool, "build", "-o", bin, "github.com/go-rdma/rdma/cmd/rdmastat").CombinedOutput()
	require.NoError(t, err, "go build: %s", built)

	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	traffic(t, c, s)
	url := serve(t, promrdma.NewCollector(promrdma.WithConnections()))
	// Enough messages for a sampled latency or two.
	require.Eventually(t, func() bool { return c.Stats().Latency.Count() >= 2 }, 20*time.Second, 10*time.Millisecond)

	out, err := exec.Command(bin, "-once", "-top", "1", "-prom", url).CombinedOutput()
	require.NoError(t, err, "rdmastat: %s", out)
	t.Logf("rdmastat said:\n%s", out)
	assert.Regexp(t, `engine soft \S+ port \d+: connections 2, SRQ posted \d+/\d+, pool in use \S+ of \S+ registered`, string(out))
	assert.Regexp(t, `ops \d+\S*, bytes \S+, latency p50 \S+ p99 \S+ \(\d+ sampled\), failed 0, queue full 0`, string(out))
	assert.Contains(t, string(out), "top 1 of 2 connections by ops")
	// The sender and the receiver count each message once: either may
	// be the busiest; its row has messages one way.
	row := regexp.MustCompile(`(?m)^\s*127\.0\.0\.1:\d+\s+127\.0\.0\.1:\d+\s+(\S+)\s+\S+\s+(\S+)\s`).FindStringSubmatch(string(out))
	require.NotNil(t, row, "a connection's row")
	assert.True(t, row[1] != "0" || row[2] != "0", "messages sent or received: %q", strings.TrimSpace(row[0]))
}
