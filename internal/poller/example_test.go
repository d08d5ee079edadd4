package poller_test

import (
	"log"

	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/internal/verbs"
)

// futures stands for the library's table of pending operations, indexed
// by WRID.
var futures []chan struct{}

// A poller for one CQ with its own completion channel. The handler only
// completes futures; it never runs user code. Close the poller before
// the CQ, and the CQ before its channel.
func ExampleNew() {
	var dev verbs.Context // an open device
	ch, err := dev.CreateCompChannel()
	if err != nil {
		log.Fatal(err)
	}
	defer ch.Close()
	cq, err := dev.CreateCQ(1024, ch)
	if err != nil {
		log.Fatal(err)
	}
	defer cq.Close()

	h := poller.HandlerFunc(func(wc []verbs.WorkCompletion) {
		for i := range wc {
			close(futures[wc[i].WRID]) // wc[i].Err() tells how it ended
		}
	})
	p, err := poller.New(cq, ch, h, poller.Config{Mode: poller.Adaptive})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Start(); err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	// ... post work; after posting, p.Kick() makes a parked poller spin
	// again so the completion is picked up without an event.
	<-p.Done() // closed after Close, or when Err says why it stopped
}
