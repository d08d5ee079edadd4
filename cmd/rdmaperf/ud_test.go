package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
)

var udNoteRE = regexp.MustCompile(`(?m)^ UD: (\d+) datagrams sent, (\d+) received, (\d+) dropped at the receiver \([0-9.]+%\)(, \d+ of them by the PacketConn's full queue)?$`)

// checkUDBW checks send_bw over UD: the client's rows as any bw test's
// (it sent every datagram), the server's with what arrived: some, at
// most all, and a note per size that says how many were sent and
// dropped, which the JSON file repeats.
func checkUDBW(t *testing.T, r pairResult, js string) {
	t.Helper()
	checkRows(t, r.cout, r.cp)
	srows := parseTable(r.sout)
	notes := udNoteRE.FindAllStringSubmatch(r.sout, -1)
	sizes := r.cp.sizes()
	require.Len(t, srows, len(sizes), r.sout)
	require.Len(t, notes, len(sizes), r.sout)
	for i, row := range srows {
		require.Len(t, row, 5, r.sout)
		assert.Equal(t, float64(sizes[i]), row[0])
		assert.Positive(t, row[1], "nothing arrived:\n%s", r.sout)
		assert.LessOrEqual(t, row[1], float64(r.cp.iters))
		// The table's two decimals round a rate of a few datagrams to
		// 0.00: the JSON file's figures are checked to be positive.
		assert.GreaterOrEqual(t, row[3], 0.0, "BW average")
		assert.GreaterOrEqual(t, row[4], 0.0, "message rate")
		sent, _ := strconv.Atoi(notes[i][1])
		got, _ := strconv.Atoi(notes[i][2])
		dropped, _ := strconv.Atoi(notes[i][3])
		assert.Equal(t, r.cp.iters, sent)
		assert.Equal(t, int(row[1]), got)
		assert.Equal(t, sent-got, dropped)
		assert.Equal(t, r.cp.api == "async", notes[i][4] != "", "the full queue's count is the async API's")
	}
	if js == "" {
		return
	}
	res := readJSON(t, js)
	require.Len(t, res, len(sizes))
	for _, x := range res {
		assert.Equal(t, "UD", x.Transport)
		assert.Equal(t, r.cp.iters, x.Sent)
		assert.Equal(t, x.Sent-x.Iters, x.Dropped)
		if x.Iters > 1 && x.Seconds > 0 { // a rate needs two datagrams, apart in time
			assert.Positive(t, x.BWAvgMiB, "BW average")
			assert.Positive(t, x.MsgRate, "message rate")
		}
	}
}

// pairUDBW runs a send_bw pair over UD with the server's JSON file
// written, for checkUDBW.
func pairUDBW(t *testing.T, args ...string) (pairResult, string) {
	t.Helper()
	js := filepath.Join(t.TempDir(), "s.json")
	return pairWith(t, func(sp, cp *params) { sp.outJSON = js }, args...), js
}

// TestUD runs send_bw and send_lat over UD (-c UD) on both APIs: the
// figures are there and sane, the header says UD and the MTU, and a run
// takes seconds.
func TestUD(t *testing.T) {
	for _, api := range []string{"verbs", "async"} {
		t.Run(api+"/send_bw", func(t *testing.T) {
			start := time.Now()
			js := filepath.Join(t.TempDir(), "s.json")
			r := pairWith(t, func(sp, cp *params) { sp.outJSON = js },
				"send_bw", "-c", "UD", "--api", api, "-s", "4096", "-n", "300", "-t", "16", "--report_gbits")
			checkUDBW(t, r, js)
			for _, out := range []string{r.cout, r.sout} {
				assert.Contains(t, out, "Connection type: UD")
				assert.Contains(t, out, "Mtu            : 4096[B]") // soft's
			}
			assert.Less(t, time.Since(start), 30*time.Second)
		})
		t.Run(api+"/send_bw/post_list", func(t *testing.T) {
			r, js := pairUDBW(t, "send_bw", "--connection", "UD", "--api", api, "-s", "2", "-n", "256", "-t", "64", "-l", "16")
			checkUDBW(t, r, js)
		})
		t.Run(api+"/send_bw/all", func(t *testing.T) {
			// -a: 2 B up to the MTU, not 8 MiB
			r, js := pairUDBW(t, "send_bw", "--transport", "ud", "--api", api, "-a", "-n", "20", "-t", "8")
			checkUDBW(t, r, js)
			assert.Len(t, r.cp.sizes(), 12, "2 B..4 KiB")
		})
		t.Run(api+"/send_lat", func(t *testing.T) {
			start := time.Now()
			js := filepath.Join(t.TempDir(), "c.json")
			out, p := pair(t, "send_lat", "-c", "UD", "--api", api, "-s", "8", "-n", "200", "--out_json", js)
			rows := checkRows(t, out, p)
			res := checkJSON(t, js, p, len(rows))
			assert.Equal(t, "UD", res[0].Transport)
			assert.Less(t, time.Since(start), 30*time.Second)
		})
	}
}

// TestUDDeep: -n 9000 posts 9000 receives on the raw path, as perftest;
// the PacketConn takes as many as the library's CQ bound leaves
// beside its send depth.
func TestUDDeep(t *testing.T) {
	for _, api := range []string{"verbs", "async"} {
		t.Run(api, func(t *testing.T) {
			r, js := pairUDBW(t, "send_bw", "-c", "UD", "--api", api, "-s", "64", "-n", "9000")
			require.Equal(t, 9000, r.sp.rxDepth)
			checkUDBW(t, r, js)
		})
	}
}

// TestUDAboveMTU: a size beyond the path MTU is refused by both sides,
// with the MTU named, before anything is sent.
func TestUDAboveMTU(t *testing.T) {
	for _, api := range []string{"verbs", "async"} {
		t.Run(api, func(t *testing.T) {
			r := runPair(t, nil, "send_bw", "-c", "UD", "--api", api, "-s", "8192", "-n", "10")
			for side, err := range map[string]error{"client": r.cErr, "server": r.sErr} {
				require.Error(t, err, side)
				assert.Contains(t, err.Error(), "-s 8192: a UD message is one packet, at most the path MTU: 4096 B", side)
			}
		})
	}
}

func TestUDParse(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"write_bw", "-c", "UD"}, "-c UD runs send_bw and send_lat"},
		{[]string{"send_bw", "-c", "UD", "--api", "stream"}, "the stream is a connection"},
		{[]string{"send_bw", "-c", "UD", "-q", "2"}, "-c UD runs one QP"},
		{[]string{"send_bw", "-c", "UD", "--api", "async", "-g", "2"}, "one goroutine"},
		{[]string{"send_bw", "-c", "XRC"}, "want RC or UD"},
	} {
		_, err := parseArgs(c.args, &bytes.Buffer{})
		if assert.Error(t, err, "%q", c.args) {
			assert.Contains(t, err.Error(), c.want, "%q", c.args)
		}
	}
	for _, args := range [][]string{{"-c", "UD"}, {"--connection", "UD"}, {"--transport", "ud"}, {"-c=UD"}} {
		p, err := parseArgs(append([]string{"send_lat"}, args...), &bytes.Buffer{})
		require.NoError(t, err, "%q", args)
		assert.True(t, p.ud, "%q", args)
	}
	// as perftest's -c UD: a receive per iteration, up to 16000
	for _, c := range []struct {
		args []string
		want int
	}{{[]string{"-n", "300"}, 300}, {[]string{"-n", "20000"}, 16000}, {[]string{"-n", "300", "-r", "64"}, 64}} {
		p, err := parseArgs(append([]string{"send_bw", "-c", "UD"}, c.args...), &bytes.Buffer{})
		require.NoError(t, err)
		assert.Equal(t, c.want, p.rxDepth, "%q", c.args)
	}
	p, err := parseArgs([]string{"send_bw", "-a"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.False(t, p.ud, "the default is RC")
	p.udMTU = 1024
	assert.Equal(t, 1024, p.maxSize(), "-a over UD ends at the MTU")
}

// TestUDVerbs runs send_bw and send_lat over UD on a verbs device (rxe
// in the VM of ./test.sh), on both APIs, one device talking to itself.
func TestUDVerbs(t *testing.T) {
	devs, err := rdma.Devices()
	require.NoError(t, err)
	if !slices.ContainsFunc(devs, func(d rdma.Device) bool { return d.Provider == rdma.ProviderVerbs && d.Usable }) {
		require.NotEqual(t, "1", os.Getenv("RDMA_TEST_REQUIRE_DEVICE"), "no usable verbs device")
		t.Skip("no usable verbs device; ./test.sh runs this on rxe in a VM")
	}
	for _, api := range []string{"verbs", "async"} {
		t.Run(api+"/send_bw", func(t *testing.T) {
			// -a: up to the device's MTU (1024 B on rxe over a veth
			// of 1500)
			js := filepath.Join(t.TempDir(), "s.json")
			r := pairWith(t, func(sp, cp *params) { sp.outJSON = js },
				"send_bw", "-c", "UD", "--provider", "verbs", "--api", api, "-a", "-n", "200", "-t", "32")
			checkUDBW(t, r, js)
			t.Logf("MTU %d B", r.cp.udMTU)
		})
		t.Run(api+"/send_lat", func(t *testing.T) {
			out, p := pair(t, "send_lat", "-c", "UD", "--provider", "verbs", "--api", api, "-s", "8", "-n", "200")
			checkRows(t, out, p)
		})
		t.Run(api+"/above MTU", func(t *testing.T) {
			r := runPair(t, nil, "send_bw", "-c", "UD", "--provider", "verbs", "--api", api, "-s", "8192", "-n", "10")
			require.Error(t, r.cErr)
			assert.Contains(t, r.cErr.Error(), fmt.Sprintf("-s %d: a UD message is one packet", 8192))
		})
	}
}

// TestUDStats: --stats prints the PacketConn's counters at the end.
func TestUDStats(t *testing.T) {
	r := pairWith(t, nil, "send_bw", "-c", "UD", "--api", "async", "-s", "64", "-n", "100", "--stats")
	// the client's hello, then the datagrams
	assert.Regexp(t, `(?m)^rdmaperf: packetconn: sent 101 received 0 `, r.cerr)
	assert.Regexp(t, `(?m)^rdmaperf: packetconn: sent 0 received \d+ dropped-queue-full 0 `, r.serr)
}
