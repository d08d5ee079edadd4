package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-rdma/rdma"
)

// Every run closes its server, client and PacketConns: quic-go's and
// the engine's goroutines must be gone when the tests end. quic-go's
// warning about socket buffers is off, as in main (see quietBuffers).
func TestMain(m *testing.M) {
	os.Setenv(quietBuffers, "true")
	goleak.VerifyTestMain(m)
}

// requests is what each test sends: enough to reuse a connection for
// many streams, few enough for the race detector and the VM.
const requests = 200

// Rule: HTTP/3 over an rdma.PacketConn on the soft provider answers
// every request with its own body, byte for byte (Run checks each one),
// and so does the same program over UDP on loopback.
func TestHTTP3(t *testing.T) {
	for _, o := range []Options{
		{Provider: rdma.ProviderSoft},
		{UDP: true},
	} {
		o.Addr, o.N, o.Size, o.Conc = "127.0.0.1:0", requests, 5000, 4
		r, err := Run(o)
		require.NoError(t, err)
		assert.Equal(t, requests, r.Requests)
		assert.LessOrEqual(t, r.P50, r.P99)
		t.Log(r)
	}
}

// Rule: the check Run relies on catches a body that is not the one the
// request asked for: one byte off, or one byte short.
func TestGetChecksBody(t *testing.T) {
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seed, _ := strconv.Atoi(r.URL.Query().Get("seed"))
		b := pattern(seed, 100)
		if seed == 1 {
			b[99]++
		} else {
			b = b[:99]
		}
		w.Write(b)
	}))
	defer bad.Close()
	c := bad.Client()
	require.ErrorContains(t, get(c, bad.URL+"/?seed=", 1, 100), "byte 99")
	require.ErrorContains(t, get(c, bad.URL+"/?seed=", 2, 100), "99 bytes, want 100")
}

// vmAddrs are the addresses of rxe0 and rxe1 in the VM (test/vm/run.sh
// sets them); elsewhere the test skips, or fails under
// RDMA_TEST_REQUIRE_DEVICE=1.
func vmAddrs(t *testing.T) (ip0, ip1 string) {
	ip0, ip1 = os.Getenv("RDMA_VM_IP0"), os.Getenv("RDMA_VM_IP1")
	if ip0 == "" || ip1 == "" {
		if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
			t.Fatal("RDMA_VM_IP0/RDMA_VM_IP1 unset and RDMA_TEST_REQUIRE_DEVICE=1")
		}
		t.Skip("runs in the VM (test.sh), between rxe0 and rxe1")
	}
	return ip0, ip1
}

// Rule: between rxe0 and rxe1 (a link crossed: a veth pair whose MTU
// the VM job raises to 9000, so rxe's path MTU is 4096), HTTP/3 over
// rdma.PacketConns answers every request byte for byte, and so does UDP
// between the same two addresses; the figures of both are logged.
func TestVerbsHTTP3(t *testing.T) {
	ip0, ip1 := vmAddrs(t)
	var rs []Result
	for _, o := range []Options{
		{Provider: rdma.ProviderVerbs},
		{UDP: true},
	} {
		o.Addr, o.Client, o.N, o.Size, o.Conc = ip0+":0", ip1+":0", requests, 5000, 4
		r, err := Run(o)
		require.NoError(t, err, "the VM job raises the veths' MTU to 9000 for this test")
		assert.Equal(t, requests, r.Requests)
		rs = append(rs, r)
		t.Log(r)
	}
	t.Logf("RDMA/UDP: %.2fx the requests/s", rs[0].PerSecond()/rs[1].PerSecond())
}

// Rule: on rxe over an Ethernet MTU of 1500 (a path MTU of 1024),
// datagrams are too small for QUIC, and Run says so before it starts,
// naming the MTU and the fix. The VM job runs this one before it raises
// the MTU.
func TestVerbsHTTP3SmallMTU(t *testing.T) {
	ip0, ip1 := vmAddrs(t)
	_, err := Run(Options{Provider: rdma.ProviderVerbs, Addr: ip0 + ":0", Client: ip1 + ":0", N: 1, Conc: 1})
	require.Error(t, err, "the VM job runs this test at the veths' MTU of 1500")
	assert.ErrorContains(t, err, "datagrams of at most 1024 bytes (its path MTU), and QUIC needs 1200")
	assert.ErrorContains(t, err, "raise the MTU")
	t.Log(err)
}
