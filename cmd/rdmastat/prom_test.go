package main

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exposition writes what promrdma's collector serves, with connections
// (WithConnections), for one engine with three connections: a sends
// 1000·k messages, b 10·k, c nothing; k is the scrape's number, so
// each scrape sees a and b grow. The names and labels are promrdma's
// (metrics/promrdma's TestRdmastat runs rdmastat against the collector
// itself); labels come in the order the client library writes them.
func exposition(k int) string {
	var b strings.Builder
	eng := `device="soft0",port="1",provider="soft"`
	fmt.Fprintf(&b, "# HELP rdma_connections Open connections.\n# TYPE rdma_connections gauge\nrdma_connections{%s} 3\n", eng)
	fmt.Fprintf(&b, "# TYPE rdma_operations_total counter\n")
	fmt.Fprintf(&b, "rdma_operations_total{%s,op=\"send\"} %d\n", eng, 1010*k)
	fmt.Fprintf(&b, "rdma_operations_total{%s,op=\"write\"} 0\n", eng)
	fmt.Fprintf(&b, "rdma_operation_bytes_total{%s,op=\"send\"} %d\n", eng, 1010*k*512)
	fmt.Fprintf(&b, "rdma_completion_failures_total{%s} 2\n", eng)
	fmt.Fprintf(&b, "rdma_completion_failures_by_status_total{%s,side=\"recv\",status=\"LOC_LEN_ERR\"} 1\n", eng)
	fmt.Fprintf(&b, "rdma_completion_failures_by_status_total{%s,side=\"send\",status=\"REM_ACCESS_ERR\"} 2\n", eng)
	fmt.Fprintf(&b, "rdma_queue_full_total{%s} 7\n", eng)
	// 10 latencies in bucket 4, [8.192 µs, 16.384 µs), and 10·k more
	// in bucket 6, [32.768 µs, 65.536 µs).
	fmt.Fprintf(&b, "# TYPE rdma_operation_latency_seconds histogram\n")
	cum := 0
	for i := range rdma.LatencyBuckets - 1 {
		switch i {
		case 4:
			cum += 10
		case 6:
			cum += 10 * k
		}
		fmt.Fprintf(&b, "rdma_operation_latency_seconds_bucket{%s,le=\"%s\"} %d\n", eng, strconv.FormatFloat(rdma.LatencyBound(i).Seconds(), 'g', -1, 64), cum)
	}
	fmt.Fprintf(&b, "rdma_operation_latency_seconds_bucket{%s,le=\"+Inf\"} %d\n", eng, cum)
	fmt.Fprintf(&b, "rdma_operation_latency_seconds_sum{%s} 0.0012\nrdma_operation_latency_seconds_count{%s} %d\n", eng, eng, cum)
	fmt.Fprintf(&b, "rdma_srq_posted_receives{%s,message_size=\"4096\"} 60\nrdma_srq_depth{%s,message_size=\"4096\"} 64\n", eng, eng)
	fmt.Fprintf(&b, "rdma_pool_in_use_bytes{%s} 2048\nrdma_pool_registered_bytes{%s} 1.048576e+06\n", eng, eng)
	fmt.Fprintf(&b, "rdma_poller_polls_total{%s} 12345\n", eng)
	for _, c := range []struct {
		local, remote string
		sends         int
	}{{"10.0.0.1:5000", "10.0.0.2:7471", 1000 * k}, {"10.0.0.1:5001", "10.0.0.3:7471", 10 * k}, {"10.0.0.1:5002", "10.0.0.4:7471", 0}} {
		l := fmt.Sprintf(`device="soft0",local=%q,port="1",provider="soft",remote=%q`, c.local, c.remote)
		fmt.Fprintf(&b, "rdma_conn_operations_total{%s,op=\"send\"} %d\n", l, c.sends)
		fmt.Fprintf(&b, "rdma_conn_operation_bytes_total{%s,op=\"send\"} %d\n", l, c.sends*512)
		fmt.Fprintf(&b, "rdma_conn_completions_total{%s} %d\n", l, c.sends)
		fmt.Fprintf(&b, "rdma_conn_credit_waits_total{%s} 3\n", l)
		fmt.Fprintf(&b, "rdma_conn_credits_out{%s} 8\n", l)
	}
	b.WriteString("# a process's own metrics are skipped\ngo_goroutines 12\n")
	return b.String()
}

// promServer serves exposition(1), exposition(2) ... one per scrape.
func promServer(t *testing.T) string {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write([]byte(exposition(int(n.Add(1)))))
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// TestParseProm: an exposition becomes the engine's counters, its SRQs,
// pool and connections, the latency buckets counts per bucket again.
func TestParseProm(t *testing.T) {
	engines, err := parseProm(strings.NewReader(exposition(1)))
	require.NoError(t, err)
	require.Len(t, engines, 1)
	e := engines[0]
	assert.Equal(t, "soft", e.Provider)
	assert.Equal(t, "soft0", e.Device)
	assert.Equal(t, uint8(1), e.Port)
	assert.Equal(t, 3, e.Conns)
	assert.Equal(t, uint64(1010), e.Total.Sends)
	assert.Equal(t, uint64(1010*512), e.Total.SendBytes)
	assert.Equal(t, uint64(2), e.Total.Failed)
	assert.Equal(t, uint64(1), e.Total.RecvFailed, "the recv side of the failures by status")
	assert.Equal(t, uint64(7), e.Total.QueueFull)
	var want rdma.LatencyHistogram
	want.Buckets[4], want.Buckets[6] = 10, 10
	want.Sum = 1200 * time.Microsecond
	assert.Equal(t, want.Buckets, e.Total.Latency.Buckets)
	assert.InDelta(t, float64(want.Sum), float64(e.Total.Latency.Sum), 1)
	assert.Equal(t, []rdma.SRQStats{{MessageSize: 4096, Posted: 60, Depth: 64}}, e.SharedReceives)
	assert.Equal(t, int64(2048), e.Pool.BytesInUse)
	assert.Equal(t, int64(1<<20), e.Pool.BytesRegistered)
	require.Len(t, e.Connections, 3)
	a := e.Connections[0]
	assert.Equal(t, "10.0.0.1:5000", a.Local)
	assert.Equal(t, "10.0.0.2:7471", a.Remote)
	assert.Equal(t, rdma.ConnStats{Sends: 1000, SendBytes: 512000, Completions: 1000, CreditWaits: 3, CreditsOut: 8}, a.Stats)
}

// TestParsePromLine: label values with escapes, special values,
// timestamps; what is not the text format is an error.
func TestParsePromLine(t *testing.T) {
	s, err := parsePromLine(`rdma_x{a="1",b="q\"uo\\te\nd",} +Inf 1700000000000`)
	require.NoError(t, err)
	assert.Equal(t, "rdma_x", s.name)
	assert.Equal(t, map[string]string{"a": "1", "b": "q\"uo\\te\nd"}, s.labels)
	assert.True(t, math.IsInf(s.value, 1))
	s, err = parsePromLine(`rdma_y 3.5e-06`)
	require.NoError(t, err)
	assert.Empty(t, s.labels)
	assert.Equal(t, 3.5e-06, s.value)
	for _, bad := range []string{`<html>`, `{"rdma": []}`, `rdma_x{a=1} 2`, `rdma_x{a="1" 2`, `rdma_x`, `rdma_x one`, `rdma_x 1 2 3`} {
		_, err := parsePromLine(bad)
		assert.Error(t, err, bad)
	}
}

// TestRunProm: -prom reads a Prometheus endpoint: the counters so far
// with -once, exact, and the top connections by rate over refreshes.
func TestRunProm(t *testing.T) {
	url := promServer(t)
	var out, errOut bytes.Buffer
	require.Equal(t, exitOK, run(t.Context(), []string{"-once", "-prom", url}, &out, &errOut), "stderr: %s", errOut.String())
	t.Logf("rdmastat said:\n%s", out.String())
	assert.Contains(t, out.String(), "engine soft soft0 port 1: connections 3, SRQ posted 60/64, pool in use 2.0KiB of 1.0MiB registered")
	// p50 is the top of bucket 4 (10 of 20), p99 98% into bucket 6.
	assert.Contains(t, out.String(), "ops 1010, bytes 505.0KiB, latency p50 16.38µs p99 64.88µs (20 sampled), failed 3, queue full 7")
	a := rows(out.String(), "10.0.0.1:5000", "10.0.0.2:7471")
	require.Len(t, a, 1)
	assert.Equal(t, []string{"10.0.0.1:5000", "10.0.0.2:7471", "1000", "500.0KiB", "0", "0B", "0B", "1000", "0", "3"}, a[0])

	out.Reset()
	require.Equal(t, exitOK, run(t.Context(), []string{"-n", "2", "-i", "50ms", "-top", "1", "-prom", url}, &out, &errOut), "stderr: %s", errOut.String())
	t.Logf("rdmastat said:\n%s", out.String())
	assert.Equal(t, 2, strings.Count(out.String(), "top 1 of 3 connections by ops/s"))
	assert.Len(t, rows(out.String(), "10.0.0.1:5000", "10.0.0.2:7471"), 2, "the busiest connection, each refresh")
	assert.Empty(t, rows(out.String(), "10.0.0.1:5001", "10.0.0.3:7471"), "not among the top 1")
	// The interval's latencies: 10 new in bucket 6, so p50 is its
	// middle and p99 99% into it.
	assert.Contains(t, out.String(), "latency p50 49.15µs p99 65.21µs (10 sampled)")
}

// TestRunPromErrors: an endpoint that is not Prometheus text, or has no
// go-rdma metrics, fails with exit 1 and says why.
func TestRunPromErrors(t *testing.T) {
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("<html>")) }))
	defer html.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("go_goroutines 3\n")) }))
	defer other.Close()
	for url, want := range map[string]string{html.URL: "not a Prometheus text endpoint", other.URL: "promrdma.NewCollector"} {
		var out, errOut bytes.Buffer
		assert.Equal(t, exitEndpoint, run(t.Context(), []string{"-once", "-prom", url}, &out, &errOut), url)
		assert.Contains(t, errOut.String(), want, url)
	}
}
