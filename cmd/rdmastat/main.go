// Command rdmastat is a live view of a process's go-rdma counters. It
// reads them from the process's expvar endpoint, where rdma.PublishExpvar
// puts them as the variable "rdma", or with -prom from its Prometheus
// endpoint, where metrics/promrdma's collector serves them:
//
//	rdmastat http://127.0.0.1:6060/debug/vars
//	rdmastat -prom http://127.0.0.1:9090/metrics
//
// Once an interval it prints, for each engine (engines of one provider,
// device and port are shown as one, as promrdma exports them), two lines:
// connections, receives posted on its shared receive queues, pool memory
// in use; then the engine's operations and bytes per second, the
// quantiles of its sampled operation latencies (rdma.LatencyHistogram)
// over the interval, failed completions and posts refused at the send
// queue limit. Then a table of its busiest connections, the -top K
// (default 10, 0 for all) by operations per second (issued and
// received):
//
//	SEND/s RECV/s     messages sent and received per second
//	SEND-B/s RECV-B/s their bytes per second
//	RW-B/s            bytes of RDMA WRITEs and READs per second
//	COMPL/s           send-side completions per second
//	FAILED CWAIT      failed completions and operations that waited for
//	                  credits, in the interval
//
// The table needs per-connection counters, which the endpoints leave out
// by default: rdma.PublishExpvar(rdma.ExpvarConnections()) for expvar,
// promrdma.NewCollector(promrdma.WithConnections()) for Prometheus.
//
// With -once it prints the counters since each connection was made and
// exits; -n stops after that many refreshes.
//
// Exit codes: 0 success; 1 the endpoint could not be read (unreachable,
// not expvar or Prometheus text, no go-rdma counters); 2 bad usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK       = 0
	exitEndpoint = 1
	exitUsage    = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type config struct {
	url      string
	prom     bool // url is a Prometheus text endpoint
	interval time.Duration
	count    int
	once     bool
	top      int // connections shown per engine, 0 for all
}

func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("rdmastat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rdmastat [flags] URL         e.g. rdmastat http://127.0.0.1:6060/debug/vars\n")
		fmt.Fprintf(stderr, "       rdmastat [flags] -prom URL   e.g. rdmastat -prom http://127.0.0.1:9090/metrics\n")
		fs.PrintDefaults()
	}
	var prom string
	fs.StringVar(&prom, "prom", "", "read a Prometheus text endpoint (metrics/promrdma) instead of expvar")
	fs.DurationVar(&cfg.interval, "i", time.Second, "interval between refreshes")
	fs.IntVar(&cfg.count, "n", 0, "refreshes to print, 0 for no end")
	fs.BoolVar(&cfg.once, "once", false, "print the counters so far, not rates, and exit")
	fs.IntVar(&cfg.top, "top", 10, "connections shown per engine, the busiest by operations per second; 0 for all")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	urls := fs.NArg()
	if prom != "" {
		urls++
	}
	if urls != 1 || cfg.interval <= 0 || cfg.count < 0 || cfg.top < 0 {
		fs.Usage()
		return cfg, false
	}
	cfg.url, cfg.prom = fs.Arg(0), prom != ""
	if cfg.prom {
		cfg.url = prom
	}
	return cfg, true
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return exitUsage
	}
	// A slow endpoint must not stall the view past a refresh or two.
	client := &http.Client{Timeout: max(2*cfg.interval, 5*time.Second)}
	read := fetch
	if cfg.prom {
		read = fetchProm
	}
	prev, err := read(ctx, client, cfg.url)
	if err != nil {
		fmt.Fprintf(stderr, "rdmastat: %v\n", err)
		return exitEndpoint
	}
	if cfg.once {
		show(stdout, nil, prev, cfg.top)
		return exitOK
	}
	tick := time.NewTicker(cfg.interval)
	defer tick.Stop()
	for i := 0; cfg.count == 0 || i < cfg.count; i++ {
		select {
		case <-ctx.Done():
			return exitOK // Ctrl-C ends the view
		case <-tick.C:
		}
		cur, err := read(ctx, client, cfg.url)
		if err != nil {
			if ctx.Err() != nil {
				return exitOK
			}
			fmt.Fprintf(stderr, "rdmastat: %v\n", err)
			return exitEndpoint
		}
		show(stdout, &prev, cur, cfg.top)
		prev = cur
	}
	return exitOK
}
