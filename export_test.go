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

// PoolDrained is closed once the pool c shares with its engine (its
// Listener's, or its own for a dialed Conn) is closed and every slab is
// freed: then the engine closes the PD and the device context.
func PoolDrained(c *Conn) <-chan struct{} { return c.eng.pool.Drained() }

// BufferAddr is the address of b's memory (0 after Release), to tell
// whether two handles got the same pool buffer.
func BufferAddr(b *Buffer) uint64 { return b.pb().Addr() }
