package rdma_test

import (
	"encoding/json"
	"expvar"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/rdmatest"
)

// scrapeExpvar reads /debug/vars as a monitoring agent does and returns
// the "rdma" variable, each engine as a JSON object.
func scrapeExpvar(t *testing.T, url string) []map[string]json.RawMessage {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var vars struct {
		RDMA []map[string]json.RawMessage `json:"rdma"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&vars))
	return vars.RDMA
}

// TestExpvarConnectionsOptIn: the expvar scrape carries the engines'
// counters and no per-connection entry by default (at 1,000 connections
// those made 296 KB a scrape); ExpvarConnections adds them, and a later
// call without it takes them out again.
func TestExpvarConnectionsOptIn(t *testing.T) {
	c, s := rdmatest.Pair(t, rdma.WithProvider(rdma.ProviderSoft))
	srv := httptest.NewServer(expvar.Handler())
	defer srv.Close()
	t.Cleanup(func() { rdma.PublishExpvar() }) // the default, for the tests after

	// conns sums the engines' connection counts and gathers their
	// per-connection entries.
	conns := func(engines []map[string]json.RawMessage) (open int, entries []rdma.ConnEntry) {
		for _, e := range engines {
			var n int
			require.NoError(t, json.Unmarshal(e["Conns"], &n))
			open += n
			if raw, ok := e["Connections"]; ok {
				var ce []rdma.ConnEntry
				require.NoError(t, json.Unmarshal(raw, &ce))
				entries = append(entries, ce...)
			}
			assert.Contains(t, e, "Total", "the engine's totals are always there")
		}
		return open, entries
	}

	rdma.PublishExpvar()
	open, entries := conns(scrapeExpvar(t, srv.URL))
	assert.GreaterOrEqual(t, open, 2, "the pair's two connections are counted")
	assert.Empty(t, entries, "no per-connection entry by default")

	rdma.PublishExpvar(rdma.ExpvarConnections())
	_, entries = conns(scrapeExpvar(t, srv.URL))
	var locals []string
	for _, e := range entries {
		locals = append(locals, e.Local)
	}
	assert.Contains(t, locals, c.LocalAddr().String(), "the client's connection, when asked for")
	assert.Contains(t, locals, s.LocalAddr().String(), "the server's connection, when asked for")

	rdma.PublishExpvar()
	_, entries = conns(scrapeExpvar(t, srv.URL))
	assert.Empty(t, entries, "a later call without the option takes them out")
}
