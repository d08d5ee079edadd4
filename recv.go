package rdma

import (
	"sync"
	"sync/atomic"

	"github.com/go-rdma/rdma/internal/verbs"
)

// receives is a connection's receive side: rmu and the state it guards,
// the messages that arrived and the Recvs that wait for them. Conn holds
// it as c.rq.
type receives struct {
	rmu      sync.Mutex
	rposted  int // receives posted (without an SRQ)
	ready    []message
	waiters  []*Future
	rwrs     []verbs.RecvWR
	rsges    []verbs.SGE
	recvSize int
	handling bool // a worker runs the RecvHandler (dispatch.go)
	ended    bool // done is closed

	beaconDone atomic.Bool // the beacon flushed: every message that came is delivered
}
