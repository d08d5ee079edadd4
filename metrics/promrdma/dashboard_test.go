package promrdma

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dashboardFile is the Grafana dashboard of promrdma's metrics, in the
// repository's docs.
var dashboardFile = filepath.Join("..", "..", "docs", "grafana", "go-rdma.json")

type dashPanel struct {
	ID      int    `json:"id"`
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

type dashboard struct {
	Panels     []dashPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// exported is the metric families the collector describes, with every
// per-connection one, by name; the value says it is a histogram.
func exported(t *testing.T) map[string]bool {
	ch := make(chan *prometheus.Desc, 1024)
	NewCollector(WithConnections()).Describe(ch)
	close(ch)
	hist := map[string]bool{}
	for _, m := range allDescs() {
		hist[m.name] = m.hist
	}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, "a Desc without fqName: %s", d)
		names[m[1]] = hist[m[1]]
	}
	require.NotEmpty(t, names)
	return names
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promVariable = regexp.MustCompile(`\$\{?\w+\}?`)
	promToken    = regexp.MustCompile(`[0-9][0-9a-zA-Z._]*|[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN"}
)

// metricNames lists the metric names a PromQL expression selects: what
// is left of it without strings, label matchers, ranges, grouping
// clauses, Grafana variables, numbers, keywords and the names of
// functions and aggregations (an identifier followed by a parenthesis).
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promVariable.ReplaceAllString(e, " ")
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range promToken.FindAllStringIndex(e, -1) {
		tok := e[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || slices.Contains(promKeywords, tok) {
			continue
		}
		if rest := strings.TrimLeft(e[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or an aggregation
		}
		names = append(names, tok)
	}
	return names
}

// family is the family a selected name belongs to: itself, or for a
// histogram's series (_bucket, _count, _sum) the histogram.
func family(name string, exported map[string]bool) (string, bool) {
	if _, ok := exported[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return base, true
		}
	}
	return "", false
}

// TestMetricNames: the extractor finds the metrics an expression
// selects, and only them, so a misspelt name cannot slip by as a
// function or a label.
func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`rdma_connections`: {"rdma_connections"},
		`sum by (op) (rate(rdma_operations_total{provider=~"$provider", op!="by (x)"}[$__rate_interval]))`:           {"rdma_operations_total"},
		`histogram_quantile(0.99, sum by (le) (rate(rdma_operation_latency_seconds_bucket{device=~"$device"}[5m])))`: {"rdma_operation_latency_seconds_bucket"},
		`sum(rate(a_sum[1m])) / sum(rate(a_count[1m] offset 1h)) > 0`:                                                {"a_sum", "a_count"},
		`rdma_a + on (port) group_left rdma_b * 1e3`:                                                                 {"rdma_a", "rdma_b"},
		`label_values(rdma_connections{provider=~"$provider"}, device)`:                                              {"rdma_connections", "device"},
	} {
		assert.Equal(t, want, metricNames(expr), expr)
	}
	names := map[string]bool{"rdma_x_total": false, "rdma_h_seconds": true}
	_, ok := family("rdma_x_totl", names)
	assert.False(t, ok, "a misspelt family")
	_, ok = family("rdma_x_total_bucket", names)
	assert.False(t, ok, "_bucket of a counter")
	f, ok := family("rdma_h_seconds_bucket", names)
	assert.True(t, ok)
	assert.Equal(t, "rdma_h_seconds", f)
}

// TestDashboard: every panel of docs/grafana/go-rdma.json queries, and
// every metric its PromQL (and the variables' label_values) names is a
// family the collector describes, a histogram's series only of a
// histogram; the dashboard covers the connections, operations, bytes,
// failures by status, latency, credits, SRQs and the pool.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err, "the dashboard ships with the module")
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	names := exported(t)

	used := map[string]bool{}
	check := func(where, expr string) {
		got := metricNames(expr)
		assert.NotEmpty(t, got, "%s: %q selects no metric", where, expr)
		for _, n := range got {
			f, ok := family(n, names)
			if assert.True(t, ok, "%s: %q names %s, which the collector does not export", where, expr, n) {
				used[f] = true
			}
		}
	}
	var walk func(ps []dashPanel)
	queried := 0
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			where := "panel " + p.Title
			assert.NotEmpty(t, p.Targets, "%s has no query", where)
			for _, tg := range p.Targets {
				require.NotEmpty(t, tg.Expr, "%s, query %s", where, tg.RefID)
				check(where, tg.Expr)
			}
			queried++
		}
	}
	walk(d.Panels)
	assert.GreaterOrEqual(t, queried, 10)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			require.NoError(t, json.Unmarshal(v.Query, &q.Query), "variable %s", v.Name)
		}
		inner, ok := strings.CutPrefix(q.Query, "label_values(")
		require.True(t, ok, "variable %s: %q is not label_values", v.Name, q.Query)
		metric, _, _ := strings.Cut(inner, ",")
		check("variable "+v.Name, metric)
	}
	for _, want := range []string{
		"rdma_connections", "rdma_connections_ended_total", "rdma_operations_total", "rdma_operation_bytes_total",
		"rdma_completion_failures_by_status_total", "rdma_operation_latency_seconds", "rdma_credit_waits_total",
		"rdma_queue_full_total", "rdma_srq_posted_receives", "rdma_pool_registered_bytes",
	} {
		assert.True(t, used[want], "no panel shows %s", want)
	}
}
