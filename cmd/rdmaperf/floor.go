package main

import (
	"fmt"
	"time"

	"github.com/go-rdma/rdma/internal/verbs"
)

// runFloor measures what the machine puts under every figure of the raw
// verbs path (--floor): the time of one call into the provider that
// polls an empty CQ once (with the verbs provider a call into C, about a
// microsecond under emulation), and of one empty poll inside such a call
// (PollSpin spinning in C). It prints one line and needs no peer.
func runFloor(p *params) error {
	prov, err := pickProvider(p.provider)
	if err != nil {
		return err
	}
	ctx, err := prov.Open(p.device)
	if err != nil {
		return err
	}
	defer ctx.Close()
	cq, err := ctx.CreateCQ(64, nil)
	if err != nil {
		return err
	}
	defer cq.Close()
	wc := make([]verbs.WorkCompletion, 16)
	const calls, spins = 20000, 1000
	poll := func(n, spins int) (time.Duration, error) {
		t0 := time.Now()
		for range n {
			if k, err := verbs.PollSpin(cq, wc, spins); err != nil || k != 0 {
				return 0, fmt.Errorf("--floor: poll of an empty CQ: %d completions, %v", k, err)
			}
		}
		return time.Since(t0), nil
	}
	if _, err := poll(calls/10, 1); err != nil { // warm up
		return err
	}
	perCall, err := poll(calls, 1)
	if err != nil {
		return err
	}
	inside, err := poll(calls/100, spins)
	if err != nil {
		return err
	}
	info := ctx.Info()
	fmt.Fprintf(p.stdout, "floor: %s %s: a call into the provider %.3f usec, an empty poll inside one %.3f usec\n",
		info.Provider, info.Name, perCall.Seconds()*1e6/calls, inside.Seconds()*1e6/(calls/100*spins))
	return nil
}
