package rdma

import (
	"expvar"
	"sync"
	"sync/atomic"
)

// An ExpvarOption changes what PublishExpvar publishes.
type ExpvarOption struct {
	conns bool
}

// ExpvarConnections adds each open connection's counters to the expvar
// variable (EngineStats.Connections). They are left out by default: at
// 1,000 connections they made a scrape of about 300 KB, for a view that
// wants the engines' totals.
func ExpvarConnections() ExpvarOption { return ExpvarOption{conns: true} }

var (
	publishOnce sync.Once
	expvarConns atomic.Bool // the variable carries EngineStats.Connections
)

// PublishExpvar publishes the counters of every open engine (AllStats)
// as the expvar variable "rdma", served at /debug/vars by expvar's
// handler: the engines' totals, SRQs, pools and pollers, and each
// connection's counters only with ExpvarConnections. Nothing is
// published unless the application calls it. The variable is published
// once; a later call sets what it carries, with or without the
// connections, from the next read on.
func PublishExpvar(opts ...ExpvarOption) {
	var conns bool
	for _, o := range opts {
		conns = conns || o.conns
	}
	expvarConns.Store(conns)
	publishOnce.Do(func() {
		expvar.Publish("rdma", expvar.Func(func() any { return allStats(expvarConns.Load()) }))
	})
}
