package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-rdma/rdma"
)

// sample is the counters of every engine of the process, as read at one
// time.
type sample struct {
	at      time.Time
	engines []rdma.EngineStats
	// connsHint says how the endpoint would carry per-connection
	// counters, shown when it has none.
	connsHint string
}

// errNoRDMA is an expvar endpoint without the "rdma" variable.
var errNoRDMA = errors.New(`no "rdma" variable (does the process call rdma.PublishExpvar?)`)

// fetch reads the expvar JSON at url and decodes its "rdma" variable.
func fetch(ctx context.Context, client *http.Client, url string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sample{}, fmt.Errorf("endpoint: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return sample{}, fmt.Errorf("reading the counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("reading the counters: %s: %s", url, resp.Status)
	}
	var vars struct {
		RDMA *[]rdma.EngineStats `json:"rdma"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&vars); err != nil {
		return sample{}, fmt.Errorf("%s is not an expvar endpoint: %w", url, err)
	}
	if vars.RDMA == nil {
		return sample{}, fmt.Errorf("%s: %w", url, errNoRDMA)
	}
	return sample{at: time.Now(), engines: *vars.RDMA, connsHint: "rdma.PublishExpvar(rdma.ExpvarConnections())"}, nil
}
