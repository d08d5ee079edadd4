package rdma

import "github.com/go-rdma/rdma/poller"

// ConnPollerStats is the counters of the poller that serves c's CQ.
func ConnPollerStats(c *Conn) poller.Stats { return c.unit.p.Stats() }

// ConnPollerConfig is the configuration of the poller that serves c's CQ.
func ConnPollerConfig(c *Conn) poller.Config { return c.unit.p.Config() }

// StopPoller stops c's poller as an error would, then fails c as
// engine.watch does when a poller stops on an error.
func StopPoller(c *Conn, err error) {
	c.unit.p.Close()
	c.fail(err)
}
