// Command rdmastat is a live view of a process's go-rdma counters. It
// reads them from the process's expvar endpoint, where rdma.PublishExpvar
// puts them as the variable "rdma", and once an interval prints, for each
// engine, a line (connections, receives posted on its shared receive
// queues, pool memory in use) and a table of its connections' rates:
//
//	rdmastat http://127.0.0.1:6060/debug/vars
//
//	SEND/s RECV/s     messages sent and received per second
//	SEND-B/s RECV-B/s their bytes per second
//	RW-B/s            bytes of RDMA WRITEs and READs per second
//	COMPL/s           send-side completions per second
//	FAILED CWAIT      failed completions and operations that waited for
//	                  credits, in the interval
//
// With -once it prints the counters since each connection was made and
// exits; -n stops after that many refreshes.
//
// Exit codes: 0 success; 1 the endpoint could not be read (unreachable,
// not expvar, no "rdma" variable); 2 bad usage.
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
	interval time.Duration
	count    int
	once     bool
}

func parse(args []string, stderr io.Writer) (cfg config, ok bool) {
	fs := flag.NewFlagSet("rdmastat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rdmastat [flags] URL   e.g. rdmastat http://127.0.0.1:6060/debug/vars\n")
		fs.PrintDefaults()
	}
	fs.DurationVar(&cfg.interval, "i", time.Second, "interval between refreshes")
	fs.IntVar(&cfg.count, "n", 0, "refreshes to print, 0 for no end")
	fs.BoolVar(&cfg.once, "once", false, "print the counters so far, not rates, and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, false
	}
	if fs.NArg() != 1 || cfg.interval <= 0 || cfg.count < 0 {
		fs.Usage()
		return cfg, false
	}
	cfg.url = fs.Arg(0)
	return cfg, true
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, ok := parse(args, stderr)
	if !ok {
		return exitUsage
	}
	// A slow endpoint must not stall the view past a refresh or two.
	client := &http.Client{Timeout: max(2*cfg.interval, 5*time.Second)}
	prev, err := fetch(ctx, client, cfg.url)
	if err != nil {
		fmt.Fprintf(stderr, "rdmastat: %v\n", err)
		return exitEndpoint
	}
	if cfg.once {
		show(stdout, nil, prev)
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
		cur, err := fetch(ctx, client, cfg.url)
		if err != nil {
			if ctx.Err() != nil {
				return exitOK
			}
			fmt.Fprintf(stderr, "rdmastat: %v\n", err)
			return exitEndpoint
		}
		show(stdout, &prev, cur)
		prev = cur
	}
	return exitOK
}
