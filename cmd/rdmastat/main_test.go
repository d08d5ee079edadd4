package main

import (
	"bytes"
	"context"
	"errors"
	"expvar"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// live is a process to watch: a soft connection pair with messages going
// from client to server until the test ends, and its expvar endpoint.
func live(t *testing.T) (url string, client, server *rdma.Conn) {
	client, server = rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		for ctx.Err() == nil {
			r := server.Recv()
			if r.Wait(ctx) != nil {
				return
			}
			r.Buffer().Release()
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		b, err := client.Alloc(512)
		if !assert.NoError(t, err) {
			return
		}
		defer b.Release()
		for ctx.Err() == nil {
			if client.Send(b).Wait(ctx) != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; <-done })
	rdma.PublishExpvar(rdma.ExpvarConnections())
	srv := httptest.NewServer(expvar.Handler())
	t.Cleanup(srv.Close)
	// Wait for the first messages, so that every refresh sees some.
	require.Eventually(t, func() bool { return server.Stats().Recvs > 0 }, 10*time.Second, time.Millisecond)
	return srv.URL + "/debug/vars", client, server
}

// row finds the table row of the connection local -> remote in out and
// returns its cells (LOCAL REMOTE SEND SEND-B RECV RECV-B RW-B COMPL
// FAILED CWAIT), one row per refresh.
func rows(out, local, remote string) [][]string {
	var found [][]string
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 10 && f[0] == local && f[1] == remote {
			found = append(found, f)
		}
	}
	return found
}

// tableRows counts the connection rows in out.
func tableRows(out string) int {
	n := 0
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) == 10 && f[0] != "LOCAL" {
			n++
		}
	}
	return n
}

func TestRunRates(t *testing.T) {
	url, c, s := live(t)
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"-n", "2", "-i", "100ms", url}, &out, &errOut)
	require.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	t.Logf("rdmastat said:\n%s", out.String())
	assert.Equal(t, 2, strings.Count(out.String(), "rates over"), "two refreshes")
	// The pair's two engines share provider, device and port: one line.
	assert.Regexp(t, `engine soft \S+ port \d+: connections 2, SRQ posted \d+/\d+, pool in use \S+ of \S+ registered`, out.String())
	assert.Regexp(t, `ops/s \S+, bytes/s \S+, latency p50 \S+ p99 \S+ \(\d+ sampled\), failed 0, queue full 0`, out.String())

	sender := rows(out.String(), c.LocalAddr().String(), c.RemoteAddr().String())
	require.Len(t, sender, 2, "a row for the client's connection per refresh")
	for _, r := range sender {
		assert.NotEqual(t, "0", r[2], "SEND/s")
		assert.NotEqual(t, "0B", r[3], "SEND-B/s")
		assert.NotEqual(t, "0", r[7], "COMPL/s")
		assert.Equal(t, "0", r[8], "FAILED")
	}
	receiver := rows(out.String(), s.LocalAddr().String(), s.RemoteAddr().String())
	require.Len(t, receiver, 2, "a row for the server's connection per refresh")
	for _, r := range receiver {
		assert.NotEqual(t, "0", r[4], "RECV/s")
		assert.NotEqual(t, "0B", r[5], "RECV-B/s")
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"-i", "0", "http://x"}, {"-n", "-1", "http://x"}, {"a", "b"}, {"-bogus", "http://x"},
		{"-prom", "http://x", "http://y"}, {"-top", "-1", "http://x"}} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitUsage, run(t.Context(), args, &out, &errOut), "%q", args)
		assert.Contains(t, errOut.String(), "usage: rdmastat", "%q", args)
	}
}

func TestRunEndpointErrors(t *testing.T) {
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	notExpvar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) }))
	defer notExpvar.Close()
	noRDMA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(`{"cmdline":["x"]}`)) }))
	defer noRDMA.Close()
	for _, url := range []string{gone.URL, notExpvar.URL, noRDMA.URL, "::not a url"} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitEndpoint, run(t.Context(), []string{"-once", url}, &out, &errOut), url)
		assert.Contains(t, errOut.String(), "rdmastat: ", url)
	}
	var out, errOut bytes.Buffer
	run(t.Context(), []string{"-once", noRDMA.URL}, &out, &errOut)
	assert.Contains(t, errOut.String(), "PublishExpvar")
}

// TestBinary runs the built command once against the live process, and
// checks the exit codes the way a shell sees them.
func TestBinary(t *testing.T) {
	url, c, _ := live(t)
	goTool, err := exec.LookPath("go")
	require.NoError(t, err, "the go command that runs the test builds rdmastat")
	bin := filepath.Join(t.TempDir(), "rdmastat")
	built, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", built)

	out, err := exec.Command(bin, "-once", url).Output()
	require.NoError(t, err)
	assert.Contains(t, string(out), "counters so far")
	sender := rows(string(out), c.LocalAddr().String(), c.RemoteAddr().String())
	require.Len(t, sender, 1)
	assert.NotEqual(t, "0", sender[0][2], "messages sent so far")

	var exit *exec.ExitError
	err = exec.Command(bin).Run()
	require.True(t, errors.As(err, &exit), "%v", err)
	assert.Equal(t, exitUsage, exit.ExitCode())
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	err = exec.Command(bin, "-once", gone.URL).Run()
	require.True(t, errors.As(err, &exit), "%v", err)
	assert.Equal(t, exitEndpoint, exit.ExitCode())
}

// TestRunTop: -top K shows the K busiest connections by operations per
// second, and says how many there are; the idle ones are left out.
func TestRunTop(t *testing.T) {
	url, c, s := live(t)
	for range 2 { // four idle connections
		rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	}
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"-n", "1", "-i", "100ms", "-top", "2", url}, &out, &errOut)
	require.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	t.Logf("rdmastat said:\n%s", out.String())
	assert.Contains(t, out.String(), "top 2 of 6 connections by ops/s")
	assert.Len(t, rows(out.String(), c.LocalAddr().String(), c.RemoteAddr().String()), 1, "the sender is among the busiest")
	assert.Len(t, rows(out.String(), s.LocalAddr().String(), s.RemoteAddr().String()), 1, "the receiver is among the busiest")
	assert.Equal(t, 2, tableRows(out.String()), "two connections shown")

	out.Reset()
	code = run(t.Context(), []string{"-once", "-top", "0", url}, &out, &errOut)
	require.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	assert.NotContains(t, out.String(), "top ")
	assert.Equal(t, 6, tableRows(out.String()), "-top 0 shows every connection")
}

// TestRunNoConnections: an expvar endpoint without per-connection
// counters (the default) still gives the engine's lines, and says how
// to get the table.
func TestRunNoConnections(t *testing.T) {
	url, _, _ := live(t)
	rdma.PublishExpvar()
	t.Cleanup(func() { rdma.PublishExpvar(rdma.ExpvarConnections()) })
	var out, errOut bytes.Buffer
	code := run(t.Context(), []string{"-n", "1", "-i", "100ms", url}, &out, &errOut)
	require.Equal(t, exitOK, code, "stderr: %s", errOut.String())
	assert.Regexp(t, `engine soft \S+ port \d+: connections 2,`, out.String())
	assert.Contains(t, out.String(), "no per-connection counters: the process would export them with rdma.PublishExpvar(rdma.ExpvarConnections())")
	assert.NotContains(t, out.String(), "LOCAL")
}
