package engine

import (
	"sync/atomic"
	"time"
)

// Credits of a shared receive queue go to the connections that ask for
// them, in the order they asked, as receives come back.
//
// A peer asks for want credits: what its messages waiting need, net of
// the credits it holds. Its first waiting chain (a Batch) of chain
// credits goes out whole or not at all: it needs need of them at once
// (chain less what the peer holds), so a grant to a waiting connection
// is never less than its need. The queue serves the oldest waiter
// first; when the receives free are fewer than its need, it waits for
// them and the ones behind it wait too (it is reserved), so a chain of
// the whole cap is served however many single messages queue behind it.
// Meanwhile the queue recalls the credits of the connections that may
// hold some they cannot use (given ahead of their asks, or part of a
// waiting chain: need < chain): a sender gives back what it holds and
// cannot use now, a chain's partial credits included, and asks again
// for the whole chain. A give-back voids the asks before it, and the
// sender sends it ahead of its next ask, so credits given back are never
// served to an ask net of them. So no connection holds part of what it
// needs while waiting for the rest (no hold-and-wait), and credits left
// over at senders come back within a recall.
//
// A waiter whose own messages fill its cap (its application does not
// read) is passed over until it takes them: one connection that does not
// read never holds up the others. A chain passed over so takes back the
// credits of the messages its application took, and from then on its
// connection gives each take's credit back at once (WaitsForRoom): the
// chain is served as soon as the takes make it room, not when a batch
// of them fills.
//
// Credits given back as the application takes messages go straight back
// to their connection while no one waits, so a connection that streams
// alone keeps its pipeline full without asking; while others wait they
// go to the queue instead.

// Grantee is a connection that takes credits from an SRQ: the receiving
// side of its credits. The SRQ reaches it only through these methods;
// they run under the SRQ's lock, so they take no lock the connection
// holds while it calls the SRQ.
type Grantee interface {
	// CreditRoom is how many more credits it may be given: its cap less
	// the credits out, the messages not taken yet and those taken whose
	// credits are not given back yet.
	CreditRoom() int
	// CreditCap is the most credits it may hold.
	CreditCap() int
	// Give records k credits given to its peer, ahead of what the peer
	// asked for when ahead is set, and tells the peer.
	Give(k int, ahead bool)
	// Given is the credits given over the connection's life, as Give
	// counts them: an ask says how many of them its peer had seen.
	Given() uint32
	// CreditsOut is what its peer holds or used on messages not yet here.
	CreditsOut() int64
	// Spare reports whether its peer may hold credits it cannot use:
	// given ahead of what it asked for.
	Spare() bool
	// WaitsForRoom says that its peer's first waiting chain was passed
	// over for room its own messages hold: until it is given credits,
	// each message its application takes gives its credit back at once.
	// It returns the credits of the messages already taken and not given
	// back yet, which the SRQ takes back now.
	WaitsForRoom() int
	// Recall asks its peer for the credits it cannot use, once until the
	// peer answers or is given more.
	Recall()
	// LookQuiet is the decay look: it recalls the credits of a peer that
	// sent nothing since the last look, and reports whether the peer
	// holds any.
	LookQuiet() bool
	// Failed reports whether it has failed: it is served no more.
	Failed() bool
}

// MaxAsk bounds a request for credits.
const MaxAsk = 1 << 16

// creditWaiter is a connection waiting for credits.
type creditWaiter struct {
	c     Grantee
	want  int // credits its peer's messages waiting need, less those given since it asked
	need  int // the least grant that lets its first waiting chain go; 0 once that was given
	chain int // the credits of that chain; need is what the peer lacks of them
	extra int // of want, credits of messages taken, to give back before the peer asks (Regrant); the rest it asked for
}

// asked is the part of w's want that its peer asked for: a grant serves
// it before the extra.
func (w *creditWaiter) asked() int { return w.want - w.extra }

// creditQueue is the waiting connections of an SRQ, oldest first. It is
// under the SRQ's mu; n is read without it.
type creditQueue struct {
	ws       []*creditWaiter
	byConn   map[Grantee]*creditWaiter
	wantSum  int64                        // want over ws
	reserved Grantee                      // the waiter the free receives are kept for, if any
	since    time.Time                    // when reserved became the waiter it is (recallLocked)
	n        atomic.Int32                 // len(ws), for a look without the lock
	solo     atomic.Pointer[creditWaiter] // the one waiter when there is one, for OthersWait
}

func (q *creditQueue) len() int { return len(q.ws) }

// lenChanged publishes len(ws) (and the waiter when it is alone) for a
// look without the lock. Caller holds the SRQ's mu.
func (q *creditQueue) lenChanged() {
	q.n.Store(int32(len(q.ws)))
	var solo *creditWaiter
	if len(q.ws) == 1 {
		solo = q.ws[0]
	}
	q.solo.Store(solo)
}

// othersWait reports, without the lock, whether connections other than
// c wait for credits.
func (q *creditQueue) othersWait(c Grantee) bool {
	switch q.n.Load() {
	case 0:
		return false
	case 1:
		w := q.solo.Load()
		return w == nil || w.c != c
	}
	return true
}

// holdsChain reports whether c waits for a chain's credits and its peer
// holds part of them: its need is less than its chain.
func (q *creditQueue) holdsChain(c Grantee) bool {
	w := q.byConn[c]
	return w != nil && w.need > 0 && w.need < w.chain
}

// add queues c for want credits, need of them at once for a chain of
// chain; extra of them are credits of takes to give back before the
// peer asks.
func (q *creditQueue) add(c Grantee, want, need, chain, extra int) {
	if q.byConn == nil {
		q.byConn = map[Grantee]*creditWaiter{}
	}
	w := &creditWaiter{c: c, want: want, need: need, chain: chain, extra: extra}
	q.ws = append(q.ws, w)
	q.byConn[c] = w
	q.wantSum += int64(want)
	q.lenChanged()
}

// forget drops w from the index and the sum; the caller takes it out
// of ws.
func (q *creditQueue) forget(w *creditWaiter) {
	delete(q.byConn, w.c)
	q.wantSum -= int64(w.want)
}

// remove takes c's record out of the queue, if it has one.
func (q *creditQueue) remove(c Grantee) {
	w := q.byConn[c]
	if w == nil {
		return
	}
	q.forget(w)
	for i, x := range q.ws {
		if x == w {
			q.ws = append(q.ws[:i], q.ws[i+1:]...)
			break
		}
	}
	if q.reserved == c {
		q.reserved = nil
	}
	q.lenChanged()
}

// headroomLocked is the receives posted and not reserved beyond the
// credits outstanding: what can be given now. Caller holds mu.
func (s *SRQ) headroomLocked() int {
	return int(s.posted.Load() - s.withdrawing.Load() - s.granted.Load())
}

// grantLocked gives c up to k credits, as far as its cap and the
// headroom allow, and tells its peer; ahead when they are more than it
// asked for, which a recall may then get back. Caller holds mu.
func (s *SRQ) grantLocked(c Grantee, k int, ahead bool) int {
	k = min(k, c.CreditRoom(), s.headroomLocked())
	if k <= 0 {
		return 0
	}
	s.granted.Add(int64(k))
	c.Give(k, ahead)
	s.armDecay() // a look recalls them if they go unused (recallQuietLocked)
	return k
}

// serveLocked gives the waiting connections credits, oldest first, as
// far as the headroom goes, and reserves the headroom for the first one
// it cannot serve yet. Caller holds mu.
func (s *SRQ) serveLocked() {
	q := &s.wq
	ws := q.ws
	prev := q.reserved
	q.reserved = nil
	free := s.headroomLocked()
	kept, i := 0, 0 // ws[:kept] are passed-over waiters kept in order
	for ; i < len(ws); i++ {
		w := ws[i]
		c := w.c
		if c.Failed() || w.want <= 0 {
			q.forget(w)
			continue
		}
		room := c.CreditRoom()
		need := max(w.need, 1)
		if room < need && w.need > 0 && w.chain > 1 {
			// A chain: the credits of messages its application took
			// may be what it lacks, waiting for their batch. They come
			// back now, and every take from now on comes back at once,
			// until it is served.
			if k := c.WaitsForRoom(); k > 0 {
				s.held.Add(-int64(k))
				room += k
			}
		}
		if room < need {
			if w.asked() == 0 {
				// Its peer holds its cap and asked for nothing more:
				// what it waits for is only credits of takes to give
				// ahead, which its next takes give anyway (Regrant).
				q.forget(w)
				continue
			}
			// Its own messages fill its cap: served once it takes them.
			// A single message's credits come back in a batch, or at
			// once when its peer holds none (Conn.tookLocked): until
			// then they are messages on their way here.
			ws[kept] = w
			kept++
			continue
		}
		if free < need {
			q.reserved = c
			break
		}
		k := min(w.want, room, free)
		got := s.grantLocked(c, k, k > w.asked()) // the asked part first
		free -= got
		w.want -= got
		w.extra = min(w.extra, w.want)
		w.need = 0
		q.wantSum -= int64(got)
		switch {
		case w.want == 0:
			q.forget(w)
		case free == 0:
			q.reserved = c // it stays first for the rest
		case w.asked() == 0:
			// Its cap cut the grant, and all it waits for is credits
			// of takes to give ahead: its next takes give them.
			q.forget(w)
		default:
			// Its cap cut the grant: served again once it takes messages.
			ws[kept] = w
			kept++
			continue
		}
		if q.reserved != nil {
			break
		}
	}
	// Put the passed-over waiters back in front of the ones not looked
	// at: a move of the few, not of the queue.
	copy(ws[i-kept:i], ws[:kept])
	clear(ws[:i-kept])
	q.ws = ws[i-kept:]
	if len(q.ws) == 0 {
		q.ws = nil
	}
	q.lenChanged()
	if q.reserved != nil && q.reserved != prev {
		q.since = s.now() // recallLocked counts from here
	}
}

// Ask serves a peer's request for want credits, need of them at once:
// what its first waiting chain, of chain credits, lacks of what the
// peer holds, when it had seen seen of the credits given (Given). It
// is served at once from the headroom when no one waits, else in turn.
// A new ask of a connection that waits replaces its old one, in its
// place. It reports whether the peer holds more than it asked for.
//
// The credits given that the peer had not seen when it asked (a grant
// on its way) count toward the ask. They are counted here, under mu,
// where every grant is made: counted before, a grant to the waiting
// record between the count and the ask would be given twice, once to
// the record and once more to its replacement, and the connection would
// hold credits for messages it no longer has (a 1,000-connection burst
// showed it, TestBurstManyConns; TestAskCountsRacingGrants).
func (s *SRQ) Ask(c Grantee, want, need, chain int, seen uint32) (spare bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unseen := max(0, int(int32(c.Given()-seen)))
	want -= unseen
	if need -= unseen; need <= 0 {
		need, chain = 1, 1 // its first chain has its credits: what else waits is asked for later
	}
	if want <= 0 {
		// What it asked for was given meanwhile.
		s.wq.remove(c)
		return want < 0
	}
	need = min(max(need, 1), c.CreditCap()) // a chain needs at most the cap (Batch.Post)
	chain = min(max(chain, need), c.CreditCap())
	want = max(want, need)
	if w := s.wq.byConn[c]; w != nil {
		s.wq.wantSum += int64(want - w.want)
		w.want, w.need, w.chain, w.extra = want, need, chain, 0
		if s.serveLocked(); s.wq.reserved != nil {
			s.refillLocked(RefillGrant) // too few posted
		}
		return false
	}
	if room := c.CreditRoom(); s.wq.len() == 0 && room >= need {
		// No one else waits: give what the connection may have, so that
		// it pipelines as with receives of its own, as long as the SRQ
		// has plenty to give; as it fills up, less, down to what was
		// asked, so that early connections do not take it all.
		//
		// Beyond what was asked, a connection gets no more than its
		// share of the SRQ among the connections on it: credits given
		// ahead and not used sit at the sender until an idle second
		// passes (creditIdle) or a recall comes.
		free := int(int64(s.depth) - s.granted.Load())
		share := s.depth / max(1, int(s.users.Load()))
		give := min(room, max(want, min(free/8, share)))
		if s.headroomLocked() < give {
			s.refillForLocked(RefillGrant, int64(give))
		}
		if s.headroomLocked() >= need {
			got := s.grantLocked(c, give, give > want)
			if got >= want {
				return false
			}
			want, need, chain = want-got, 1, 1
		}
	}
	s.wq.add(c, want, need, chain, 0)
	s.refillLocked(RefillGrant)
	return false
}

// Regrant gives c back the credits of k messages its application took,
// while no other connection waits: c streams, and keeps its pipeline
// full without asking. While others wait the receives go to them.
func (s *SRQ) Regrant(c Grantee, k int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.wq.byConn[c]
	switch {
	case w != nil && s.wq.len() == 1:
		// c streams alone and waits, for receives to be posted or for
		// its own messages to be taken: these add to what it is given.
		d := min(w.want+k, MaxAsk) - w.want
		w.want += d
		w.extra += d
		s.wq.wantSum += int64(d)
		if s.serveLocked(); s.wq.reserved != nil {
			s.refillLocked(RefillGrant) // too few posted
		}
	case s.wq.len() > 0:
		// Others wait: the receives go to them, in turn.
		s.refillLocked(RefillGrant)
	default:
		if got := s.grantLocked(c, k, true); got < k {
			// Too few receives posted: the refill gives the rest.
			s.refillForLocked(RefillGrant, int64(k-got))
			if got += s.grantLocked(c, k-got, true); got < k {
				s.wq.add(c, k-got, 1, 1, k-got)
			}
		}
	}
}

// GiveBack takes back n credits c's peer did not use; c has taken them
// off its own count. A peer gives back all it holds, on a recall or
// idle, and asks again afterwards for what it still has waiting: an ask
// of c's still queued is void (it is net of the credits given back, and
// served with them it would hand the peer part of a chain it cannot
// send).
func (s *SRQ) GiveBack(c Grantee, n int) {
	s.mu.Lock()
	s.wq.remove(c)
	if n > 0 {
		s.granted.Add(-int64(n))
		s.serveLocked()
	}
	s.mu.Unlock()
	if n > 0 {
		s.armDecay() // the receives behind them may be left over
	}
}

// Arrived accounts for a message that used a credit and a receive.
func (s *SRQ) Arrived() {
	s.granted.Add(-1)
	s.held.Add(1)
}

// Taken accounts for k messages whose credits are given back or no
// longer needed: their receives may be posted again.
func (s *SRQ) Taken(k int64) { s.held.Add(-k) }

// OthersWait reports whether connections other than c wait for credits:
// then the credits of messages c's application takes go back to the
// queue at once rather than in a batch. c itself waiting alone (its peer
// streams, asking for more as it goes) is no reason to give each credit
// back on its own.
func (s *SRQ) OthersWait(c Grantee) bool { return s.wq.othersWait(c) }

// Leave takes c off s: c is torn down and no message of its can come
// any more. held are its messages whose credits were not given back,
// out the credits it had given (c's counts are zero now).
func (s *SRQ) Leave(c Grantee, held int64, out int) {
	s.mu.Lock()
	s.wq.remove(c)
	delete(s.members, c)
	s.mu.Unlock()
	s.held.Add(-held)
	s.GiveBack(c, out)
}

// join puts c on s. Caller holds s.e.mu (SRQFor).
func (s *SRQ) join(c Grantee) {
	s.mu.Lock()
	if s.members == nil {
		s.members = map[Grantee]struct{}{}
	}
	s.members[c] = struct{}{}
	s.mu.Unlock()
}

// recallGap is the least time between two recalls of an SRQ's credits:
// one walks the engine's connections.
const recallGap = time.Millisecond

// recallAllAfter is how long the reserved waiter waits before every
// connection holding credits is recalled (recallLocked).
const recallAllAfter = 20 * time.Millisecond

// now is the time for recallAllAfter: the clock, or an SRQHand's.
// Caller holds mu.
func (s *SRQ) now() time.Time {
	if s.hand != nil {
		return s.hand.now
	}
	return time.Now()
}

// recallLocked asks the connections on s that may hold credits they
// cannot use now to give them back: those given credits beyond what they
// asked for, and waiting chains whose peer holds part of them
// (holdsChain), but not the waiter the headroom is kept for. Connections
// that asked and were given what they asked for use it all: recalling
// them would cost a frame each for nothing. One that holds credits
// otherwise (an ask netted wrongly did that, until Ask counted the
// credits on their way under mu) would give them back only at the decay
// look (srqDecay), a second on: so once the reserved waiter has waited
// recallAllAfter, every connection that holds credits and does not wait
// itself is asked, which bounds the wait whatever left them there. At
// most once a recallGap; the retry timer looks again while the reserved
// waiter waits. Caller holds mu.
func (s *SRQ) recallLocked() {
	if s.wq.reserved == nil {
		return // the waiters left wait for their own messages to be taken
	}
	if now := time.Now(); now.Sub(s.recallAt) >= recallGap {
		s.recallAt = now
		all := s.now().Sub(s.wq.since) >= recallAllAfter
		for c := range s.members {
			if c.CreditsOut() > 0 && c != s.wq.reserved &&
				(c.Spare() || s.wq.holdsChain(c) || all && s.wq.byConn[c] == nil) {
				c.Recall()
			}
		}
	}
	s.retry.Reset(max(srqRetry, recallGap))
}
