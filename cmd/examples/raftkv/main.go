// Command raftkv is a replicated key-value store on hashicorp/raft whose
// nodes talk over the go-rdma stream: the stream's Listen and Dialer are
// raft's StreamLayer, and nothing else changes. It starts a cluster of
// -nodes in one process, commits -ops puts of -size bytes from
// -concurrency goroutines through the leader, checks that every node
// applied the same store, and reports the commit latency and throughput,
// over RDMA and over TCP loopback for comparison.
//
//	raftkv                          # both transports, 3 nodes, 2,000 puts
//	raftkv -transport rdma -ops 10000
//
// The provider is $RDMA_PROVIDER (auto by default: soft where no RDMA
// device exists). Exit codes: 0 ok, 1 errors, 2 bad usage.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	transport := flag.String("transport", "both", "rdma, tcp or both")
	nodes := flag.Int("nodes", 3, "cluster size")
	ops := flag.Int("ops", 2000, "puts to commit")
	size := flag.Int("size", 128, "bytes per value")
	conc := flag.Int("concurrency", 16, "goroutines applying puts")
	flag.Parse()
	var kinds []string
	switch *transport {
	case "both":
		kinds = []string{"rdma", "tcp"}
	case "rdma", "tcp":
		kinds = []string{*transport}
	default:
		flag.Usage()
		os.Exit(2)
	}
	if flag.NArg() != 0 || *nodes < 1 || *ops < 1 || *size < 1 || *conc < 1 {
		flag.Usage()
		os.Exit(2)
	}
	var results []Result
	for _, k := range kinds {
		r, err := Run(Params{Transport: k, Nodes: *nodes, Ops: *ops, Size: *size, Concurrency: *conc, Timeout: 2 * time.Minute})
		if err != nil {
			fmt.Fprintf(os.Stderr, "raftkv: %s: %v\n", k, err)
			os.Exit(1)
		}
		fmt.Println(r)
		results = append(results, r)
	}
	if len(results) == 2 {
		a, b := results[0], results[1]
		fmt.Printf("rdma/tcp: throughput %.2fx, median commit latency %.2fx\n",
			a.OpsPerSec/b.OpsPerSec, a.P50.Seconds()/b.P50.Seconds())
	}
}

// String is one line of figures.
func (r Result) String() string {
	return fmt.Sprintf("%-4s %d nodes: %d puts in %v, %.0f puts/s, commit latency p50 %v p99 %v",
		r.Transport, r.Nodes, r.Ops, r.Elapsed.Round(time.Millisecond), r.OpsPerSec,
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
}
