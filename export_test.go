package rdma

import "github.com/go-rdma/rdma/poller"

// ConnPollerStats is the counters of the poller that serves c's CQ.
func ConnPollerStats(c *Conn) poller.Stats { return c.unit.p.Stats() }

// ConnPollerConfig is the configuration of the poller that serves c's CQ.
func ConnPollerConfig(c *Conn) poller.Config { return c.unit.p.Config() }
