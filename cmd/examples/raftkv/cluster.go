package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Params says what Run does.
type Params struct {
	Transport   string // "rdma" or "tcp"
	Nodes       int
	Ops         int // puts to commit
	Size        int // bytes per value
	Concurrency int // goroutines applying puts
	Timeout     time.Duration
}

// Result is what Run measured.
type Result struct {
	Transport string
	Nodes     int
	Ops       int
	Elapsed   time.Duration
	OpsPerSec float64
	P50, P99  time.Duration // commit latency: Apply until its future resolves
}

// node is one raft server with its store and transport.
type node struct {
	id    raft.ServerID
	r     *raft.Raft
	fsm   *store
	trans *raft.NetworkTransport
}

// Run starts a cluster, commits p.Ops puts through its leader, checks
// that every node applied all of them, and shuts the cluster down.
func Run(p Params) (res Result, err error) {
	deadline := time.Now().Add(p.Timeout)
	nodes, err := start(p)
	defer func() { err = errors.Join(err, stop(nodes)) }()
	if err != nil {
		return res, err
	}
	leader, err := waitLeader(nodes, time.Until(deadline))
	if err != nil {
		return res, err
	}

	lat := make([]time.Duration, p.Ops)
	value := make([]byte, p.Size)
	var wg sync.WaitGroup
	errs := make([]error, p.Concurrency)
	t0 := time.Now()
	for g := range p.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < p.Ops; i += p.Concurrency {
				start := time.Now()
				f := leader.r.Apply(encodePut("key"+strconv.Itoa(i), value), time.Until(deadline))
				if err := f.Error(); err != nil {
					errs[g] = fmt.Errorf("put %d: %w", i, err)
					return
				}
				if err, _ := f.Response().(error); err != nil {
					errs[g] = err
					return
				}
				lat[i] = time.Since(start)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if err := converge(nodes, leader, time.Until(deadline)); err != nil {
		return res, err
	}
	slices.Sort(lat)
	return Result{
		Transport: p.Transport, Nodes: p.Nodes, Ops: p.Ops, Elapsed: elapsed,
		OpsPerSec: float64(p.Ops) / elapsed.Seconds(),
		P50:       lat[len(lat)/2], P99: lat[len(lat)*99/100],
	}, nil
}

// start makes p.Nodes servers and bootstraps them as one cluster.
func start(p Params) ([]*node, error) {
	var nodes []*node
	var servers []raft.Server
	for i := range p.Nodes {
		layer, err := listen(p.Transport)
		if err != nil {
			return nodes, err
		}
		trans := raft.NewNetworkTransport(layer, 3, 10*time.Second, io.Discard)
		n := &node{id: raft.ServerID("node" + strconv.Itoa(i)), fsm: newStore(), trans: trans}
		nodes = append(nodes, n)
		servers = append(servers, raft.Server{ID: n.id, Address: trans.LocalAddr()})
	}
	for _, n := range nodes {
		cfg := raft.DefaultConfig()
		cfg.LocalID = n.id
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Off})
		// Loopback: elect within about 100 ms, not a second.
		cfg.HeartbeatTimeout = 100 * time.Millisecond
		cfg.ElectionTimeout = 100 * time.Millisecond
		cfg.LeaderLeaseTimeout = 50 * time.Millisecond
		cfg.CommitTimeout = 5 * time.Millisecond
		logs := raft.NewInmemStore()
		r, err := raft.NewRaft(cfg, n.fsm, logs, logs, raft.NewInmemSnapshotStore(), n.trans)
		if err != nil {
			return nodes, err
		}
		n.r = r
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			return nodes, fmt.Errorf("bootstrap %s: %w", n.id, err)
		}
	}
	return nodes, nil
}

// waitLeader waits until one node is leader and every node knows it.
func waitLeader(nodes []*node, limit time.Duration) (*node, error) {
	obs := make(chan raft.Observation, 16*len(nodes))
	for _, n := range nodes {
		o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
			_, ok := o.Data.(raft.LeaderObservation)
			return ok
		})
		n.r.RegisterObserver(o)
		defer n.r.DeregisterObserver(o)
	}
	timeout := time.After(limit)
	for {
		for _, n := range nodes {
			if n.r.State() != raft.Leader {
				continue
			}
			known := true
			for _, m := range nodes {
				_, id := m.r.LeaderWithID()
				known = known && id == n.id
			}
			if known {
				return n, nil
			}
		}
		select {
		case <-obs: // a node saw a leader change: look again
		case <-timeout:
			return nil, fmt.Errorf("no leader within %v", limit)
		}
	}
}

// converge waits until every node's store applied what the leader's
// did, then checks that their stores are the leader's. It asks the
// stores, not raft: raft's AppliedIndex counts the entries it handed to
// a store, which may not have applied them yet.
func converge(nodes []*node, leader *node, limit time.Duration) error {
	// The leader's store has applied everything before the barrier
	// once it resolves.
	if err := leader.r.Barrier(limit).Error(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	want := leader.fsm.appliedIndex()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	timeout := time.After(limit)
	for _, n := range nodes {
		for n.fsm.appliedIndex() < want {
			select {
			case <-t.C: // followers apply on their own: look again
			case <-timeout:
				return fmt.Errorf("%s applied up to entry %d of %d", n.id, n.fsm.appliedIndex(), want)
			}
		}
		if n != leader && !n.fsm.equal(leader.fsm) {
			return fmt.Errorf("%s holds %d keys, the leader %d: the stores differ", n.id, n.fsm.len(), leader.fsm.len())
		}
	}
	return nil
}

// stop shuts every node down and closes its transport. The transport's
// Close stops its listener only; CloseStreams closes the connections it
// dialed, so that the peers' goroutines reading them return.
func stop(nodes []*node) error {
	var errs []error
	for _, n := range nodes {
		if n.r != nil {
			errs = append(errs, n.r.Shutdown().Error())
		}
	}
	for _, n := range nodes {
		n.trans.CloseStreams()
		errs = append(errs, n.trans.Close())
	}
	return errors.Join(errs...)
}
