package engine

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// The credit grants of a shared receive queue (credits.go), on the rig
// of grants_rig_test.go: a real SRQ over the soft provider and fake
// connections that ask for, use, give back and answer recalls of its
// credits as the root package's Conn does.
//
// After every step (grantRig.check):
//   - the SRQ's credits out are the connections', and each connection's
//     are at its sender, in its credit word, on their way back or used by
//     a message in flight;
//   - they are never more than the receives posted and not withdrawing
//     (the SRQ grants at most its headroom; a message that found no
//     receive would fail its SEND on the soft device);
//   - no connection holds more than its cap: credits out, messages held
//     and taken (CreditRoom ≥ 0).
//
// At the end of a test, no more posts (grantRig.settle): the steps that
// answer recalls, hand messages over and let the applications take
// them, in a random order, and the timers when nothing else can run.
// Then the progress properties hold:
//   - no hold-and-wait: every chain of a connection whose application
//     reads goes out, a chain of the whole cap behind single messages
//     too, and with many connections;
//   - a connection whose application does not read waits only for a
//     chain its own messages leave no room for: it holds no one up.
//
// The design says they hold promptly: by the recalls of the SRQ's
// retry timer alone (pace promptly), and the tests check them so, on
// the random walks (TestGrantsProgress, FuzzGrants) and on every case of
// TestGrantsTable.
//
// The defects the rig found, each a case of TestGrantsTable (fixed;
// before, they waited for the decay look, or for good):
//   - A chain waiter was passed over for room (serveLocked: room < need)
//     while the credits of messages its application took waited for
//     their batch (Conn.tookLocked gave back at once only the first take
//     after a short ask): it waited for the decay look's recall, 1 to
//     2 s. Now the SRQ takes those credits back when it passes a chain
//     over, and every take after gives its credit back at once until the
//     chain is served (Grantee.WaitsForRoom). "a Batch of the cap after
//     40 and 24 messages (issue 30)".
//   - An ask's need is net of the credits its sender holds: a sender
//     holding all but one credit of its first chain asked need 1, and
//     holdsChain (need > 1) left it out of the recalls. Now an ask says
//     its chain too, and holdsChain is need < chain. "a sender missing
//     one credit of its chain, behind a chain of the cap".
//   - A non-reader's net need fitted its room though its chain did not,
//     so it was given credits it could never use; recalled, it gave them
//     back, and GiveBack's serveLocked served its own old ask with them
//     before its new one came: a chain of the cap elsewhere waited, in
//     some walks for good (the fuzz seed in testdata/fuzz/FuzzGrants is
//     one). Now a give-back voids the asks before it (SRQ.GiveBack). "a
//     non-reader keeps a credit of a chain it has no room for".
//   - An ask that overtook its own give-back (the ask job was queued
//     before the recall's answer queued the give-back, Conn.onRecall) was
//     passed over for room; the give-back then cleared peerWants
//     (Conn.onCreditBack), so the takes that made the room regranted
//     nothing, and the connection waited for good, even alone on the
//     SRQ. Now an ask sends the give-backs before it ahead of itself
//     (Conn.askCredits). "an ask that overtakes its own give-back".
//   - Credits given after a peer's give-back or beyond its ask (a WRITE
//     the peer had not seen) lost their spare mark to the give-back or
//     the ask, and no recall got them back. Now onCreditBack and
//     onCreditAsk keep the mark for them. The regression walks of
//     TestGrantsProgress.

// walkConfig says what a random walk may do.
type walkConfig struct {
	steps      int
	nonReaders bool // connections whose application does not read
	pace       pace // the timers that settle lets fire
	progress   bool // check the progress properties at rest
}

// grantWalk makes a rig of a few connections on an SRQ of a random
// depth, walks it cfg.steps random steps and lets it settle.
func grantWalk(t *testing.T, e *Engine, ch choices, cfg walkConfig) *grantRig {
	depths := []int{4, 8, 16, 64}
	depth := depths[ch.intn(len(depths))]
	pick := &grantRig{ch: ch, depth: depth}
	var caps []int
	var reads []bool
	for range 1 + ch.intn(6) {
		caps = append(caps, pick.randCap())
		reads = append(reads, !cfg.nonReaders || ch.intn(5) > 0)
	}
	r := newGrantRig(t, e, depth, ch, caps, reads)
	r.noNonReaders = !cfg.nonReaders
	r.walk(cfg.steps)
	r.noProgress = !cfg.progress
	r.settle(20000, cfg.pace)
	return r
}

// TestGrantsSafety walks 100 rigs 400 random steps each (about 60,000
// steps with the settling, 1 s with -race) and checks after every step
// that the SRQ never grants beyond its headroom nor a connection beyond
// its cap. The walks then settle with every timer, the decay look's and
// the idle ones too, without checking progress: TestGrantsProgress
// does.
func TestGrantsSafety(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 20
	}
	e := openSoftEngine(t)
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			grantWalk(t, e, newSeeded(seed), walkConfig{steps: 400, nonReaders: true, pace: eventually})
		})
	}
}

// TestGrantsProgress checks the progress properties on random walks,
// promptly (by the SRQ's recalls alone): with connections whose
// applications do not read, with every application reading, and on the
// walks that found the lost spare marks (see above).
func TestGrantsProgress(t *testing.T) {
	e := openSoftEngine(t)
	t.Run("promptly", func(t *testing.T) {
		for seed := range uint64(200) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				grantWalk(t, e, newSeeded(seed), walkConfig{steps: 300, nonReaders: true, pace: promptly, progress: true})
			})
		}
	})
	t.Run("readers", func(t *testing.T) {
		for seed := range uint64(2000) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				grantWalk(t, e, newSeeded(seed), walkConfig{steps: 300, pace: promptly, progress: true})
			})
		}
	})
	regressions := []struct {
		seed   uint64
		cfg    walkConfig
		defect string
	}{
		{101980, walkConfig{steps: 600, nonReaders: true}, "a credit given after a give-back, unmarked"},
		{203781, walkConfig{steps: 400}, "a credit given after a give-back, unmarked"},
		{204821, walkConfig{steps: 400}, "credits given beyond an ask, unmarked"},
	}
	for _, tt := range regressions {
		t.Run(fmt.Sprint("regression/", tt.seed), func(t *testing.T) {
			tt.cfg.pace, tt.cfg.progress = promptly, true
			grantWalk(t, e, newSeeded(tt.seed), tt.cfg)
		})
	}
}

// TestGrantsReplay walks a seed twice: the same steps, the same end. A
// failure of the walks replays from its seed.
func TestGrantsReplay(t *testing.T) {
	e := openSoftEngine(t)
	var ends [2]string
	for i := range ends {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			r := grantWalk(t, e, newSeeded(7), walkConfig{steps: 400, nonReaders: true, pace: eventually})
			ends[i] = fmt.Sprint(r.steps, "\n", r.state())
		})
	}
	require.Equal(t, ends[0], ends[1])
}

// FuzzGrants walks a rig by the fuzzer's bytes, a choice each, and
// checks what TestGrantsSafety and TestGrantsProgress do.
func FuzzGrants(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("\x03\x05\x10\x20\x30\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Add([]byte("\x02\x01\x07\xff\x00\xff\x00\x80\x40\x20\x10\x08\x04\x02\x01\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99"))
	e := openSoftEngine(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		grantWalk(t, e, newFuzzed(b), walkConfig{steps: 2000, nonReaders: true, pace: promptly, progress: true})
	})
}

// grantScript sets a case up: c are the rig's connections, in the order
// they joined.
type grantScript func(r *grantRig, c []*fakeConn)

// postEach posts n chains of k messages on each of cs.
func postEach(cs []*fakeConn, n, k int) {
	for _, c := range cs {
		for range n {
			c.post(k)
		}
	}
}

// TestGrantsTable runs scripted cases, each settled in 20 random orders
// (seeds; 5 for the largest): the defect of issue 30, the cases the
// design names, and the defects the walks found. Every case settles
// promptly, by the SRQ's recalls alone, as the design says it does.
func TestGrantsTable(t *testing.T) {
	same := func(n, c int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = c
		}
		return s
	}
	tests := []struct {
		name   string
		depth  int
		caps   []int
		reads  []bool // nil: all read
		script grantScript
		seeds  int    // settling orders; 0: 20
		defect string // the defect it showed (see above): what held it up
	}{{
		name:  "a Batch of the cap after 40 and 24 messages (issue 30)",
		depth: 64, caps: []int{64, 64},
		script: func(r *grantRig, c []*fakeConn) {
			postEach(c[:1], 40, 1)
			postEach(c[1:], 24, 1)
			postEach(c, 1, 64)
		},
		defect: "a chain passed over for room while taken credits waited for their batch",
	}, {
		name:  "a Batch of the cap while holding partial credits (issue 30)",
		depth: 64, caps: []int{64, 64},
		script: func(r *grantRig, c []*fakeConn) {
			postEach(c[:1], 40, 1)
			postEach(c[1:], 24, 1)
			r.quiet() // taken: their credits go back ahead of the asks
			postEach(c, 1, 64)
		},
	}, {
		name:  "32 connections looping on Batches of the cap (issue 30)",
		depth: 64, caps: same(32, 64), seeds: 5,
		script: func(r *grantRig, c []*fakeConn) {
			for range 2 {
				postEach(c, 2, 64)
				r.quiet()
			}
		},
		defect: "a chain passed over for room while taken credits waited for their batch",
	}, {
		name:  "a chain of the whole cap behind many single messages",
		depth: 32, caps: append([]int{32}, same(16, 4)...),
		script: func(r *grantRig, c []*fakeConn) {
			postEach(c[1:], 4, 1)
			c[0].post(32)
			postEach(c[1:], 4, 1)
		},
	}, {
		name:  "a chain of the whole cap while single messages keep coming",
		depth: 32, caps: append([]int{32}, same(16, 4)...),
		script: func(r *grantRig, c []*fakeConn) {
			postEach(c[1:], 2, 1)
			c[0].post(32)
			// The waiting chain is served first: within 20 rounds of
			// load, however many single messages keep coming.
			r.underLoad(20, func() {
				for _, x := range c[1:] {
					if x.pendingMsgs() < 2 {
						x.post(1)
					}
				}
			}, func() bool { return len(c[0].pending) == 0 })
		},
	}, {
		name:  "an application that does not read holds up no one",
		depth: 16, caps: []int{8, 16, 16}, reads: []bool{false, true, true},
		script: func(r *grantRig, c []*fakeConn) {
			postEach(c[:1], 8, 1)
			r.quiet() // c0 holds 8 messages: its cap
			c[0].post(4)
			c[1].post(16)
			postEach(c[2:], 16, 1)
		},
	}, {
		name:  "a sender missing one credit of its chain, behind a chain of the cap",
		depth: 4, caps: []int{4, 4},
		script: func(r *grantRig, c []*fakeConn) {
			c[0].post(1)
			r.quiet() // the take's credit goes back to c0 ahead of its asks
			r.recalled()
			c[1].post(4) // reserved; the recall waits for recallGap
			c[1].runSenderJob()
			c[1].deliverToRecv()
			c[0].post(2) // it holds 1: its ask (need 1) makes it no spare
			c[0].runSenderJob()
			c[0].deliverToRecv()
		},
		defect: "an ask's need is net of what the sender holds: need 1 was no chain to recall (holdsChain)",
	}, {
		name:  "a non-reader keeps a credit of a chain it has no room for",
		depth: 4, caps: []int{2, 4}, reads: []bool{false, true},
		script: func(r *grantRig, c []*fakeConn) {
			c[0].post(1)
			c[0].post(2)
			r.quiet() // c0 sent 1 and holds 1 credit of its chain of 2
			c[1].post(4)
		},
		defect: "an ask is net of the credits held, so a non-reader's fitted its room though its chain did not; " +
			"its give-back on a recall served its own old ask",
	}, {
		name:  "an ask that overtakes its own give-back",
		depth: 8, caps: []int{8},
		script: func(r *grantRig, c []*fakeConn) {
			c0 := c[0]
			c0.post(8)
			c0.runSenderJob()
			c0.deliverToRecv() // granted 8
			c0.post(5)
			c0.post(1)
			c0.runRecvJob()
			c0.deliverToSender() // sends 8; an ask for [5 1] is queued
			r.poll(3)
			for range 3 {
				c0.took() // their credits go back ahead: 3 at the sender
			}
			r.fireDecay()
			r.fireDecay() // quiet for a look: recalled
			c0.runRecvJob()
			c0.deliverToSender() // gives back 3, after the ask queued
			for len(c0.sjobs) > 0 {
				c0.runSenderJob()
			}
			for len(c0.toRecv) > 0 {
				c0.deliverToRecv() // the give-back, then the ask (askCredits sends it ahead)
			}
		},
		defect: "the give-back after the ask cleared peerWants: the takes that made room gave their credits to no one, " +
			"and nothing served the waiter again",
	}}
	e := openSoftEngine(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seeds := tt.seeds
			if seeds == 0 {
				seeds = 20
			}
			for seed := range uint64(seeds) {
				t.Run(fmt.Sprint(seed), func(t *testing.T) {
					reads := tt.reads
					if reads == nil {
						reads = make([]bool, len(tt.caps))
						for i := range reads {
							reads[i] = true
						}
					}
					r := newGrantRig(t, e, tt.depth, newSeeded(seed), tt.caps, reads)
					tt.script(r, r.conns)
					r.check()
					r.settle(100000, promptly)
				})
			}
		})
	}
}
