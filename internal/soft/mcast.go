package soft

import (
	"fmt"
	"slices"
	"sync"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Multicast on soft0 stays in the process: a datagram sent to a group
// reaches the UD QPs of this process attached to it (the process is the
// host and its one device), never another process, whatever the
// transport. The bounds keep a send's fan-out and the table small.
const (
	maxMcastGroups   = 1024 // groups with a QP attached (max_mcast_grp)
	maxMcastQPAttach = 64   // QPs attached to one group (max_mcast_qp_attach)
)

// mcast is the process's group table: the QPs attached to each group,
// in the order they attached.
var mcast = struct {
	sync.RWMutex
	groups map[verbs.GID][]*qp
}{groups: map[verbs.GID][]*qp{}}

func (q *qp) AttachMcast(gid verbs.GID, lid uint16) error {
	if err := q.checkMcast("attach", gid); err != nil {
		return err
	}
	if !q.lt.Enter() {
		return errClosed("attach mcast")
	}
	defer q.lt.Exit()
	mcast.Lock()
	defer mcast.Unlock()
	members := mcast.groups[gid]
	switch {
	case slices.Contains(members, q):
		return nil
	case members == nil && len(mcast.groups) >= maxMcastGroups:
		return fmt.Errorf("soft: attach mcast %v: %w: %d groups in use, the device's max_mcast_grp", gid, verbs.ErrInvalid, maxMcastGroups)
	case len(members) >= maxMcastQPAttach:
		return fmt.Errorf("soft: attach mcast %v: %w: %d QPs attached, the device's max_mcast_qp_attach", gid, verbs.ErrInvalid, maxMcastQPAttach)
	}
	mcast.groups[gid] = append(members, q)
	return nil
}

func (q *qp) DetachMcast(gid verbs.GID, lid uint16) error {
	if err := q.checkMcast("detach", gid); err != nil {
		return err
	}
	if !q.lt.Enter() {
		return errClosed("detach mcast")
	}
	defer q.lt.Exit()
	mcast.Lock()
	defer mcast.Unlock()
	if !detachLocked(gid, q) {
		return fmt.Errorf("soft: detach mcast %v: %w: QP %#x is not attached to it", gid, verbs.ErrInvalid, q.qpn)
	}
	return nil
}

func (q *qp) checkMcast(what string, gid verbs.GID) error {
	if q.typ != verbs.UD {
		return fmt.Errorf("soft: %s mcast: %w: %v QP %#x; multicast needs a UD QP", what, verbs.ErrInvalid, q.typ, q.qpn)
	}
	if !gid.IsMulticast() {
		return fmt.Errorf("soft: %s mcast: %w: %v is not a multicast GID", what, verbs.ErrInvalid, gid)
	}
	return nil
}

// detachLocked removes q from group gid and reports whether it was
// there. Caller holds mcast's lock.
func detachLocked(gid verbs.GID, q *qp) bool {
	members := mcast.groups[gid]
	i := slices.Index(members, q)
	if i < 0 {
		return false
	}
	members = slices.Delete(members, i, i+1)
	if len(members) == 0 {
		delete(mcast.groups, gid)
	} else {
		mcast.groups[gid] = members
	}
	return true
}

// detachAll removes q from every group (Close), before its references
// drain: no send finds it afterwards.
func detachAll(q *qp) {
	if q.typ != verbs.UD {
		return
	}
	mcast.Lock()
	defer mcast.Unlock()
	for gid := range mcast.groups {
		detachLocked(gid, q)
	}
}

// groupMembers holds and returns the QPs attached to group gid, at most
// maxMcastQPAttach, in buf; the caller releases each.
func groupMembers(gid verbs.GID, buf *[maxMcastQPAttach]*qp) []*qp {
	mcast.RLock()
	defer mcast.RUnlock()
	out := buf[:0]
	for _, r := range mcast.groups[gid] {
		r.refs.acquire()
		out = append(out, r)
	}
	return out
}

// execMcast serves a UD send through an AH to a multicast group: each
// attached QP gets the datagram (respondUD checks its state and Q_Key)
// with the group as the GRH's destination. A datagram sent to a group
// with another QPN than verbs.MulticastQPN is lost, as the responders of
// a multicast packet drop it. w holds the resolved source.
func (q *qp) execMcast(s *sendSlot, w *sgl, dst, qkey uint32) {
	if dst != verbs.MulticastQPN {
		return
	}
	var buf [maxMcastQPAttach]*qp
	rs := groupMembers(s.ah.group, &buf)
	var req request
	ctx := q.ctx()
	for _, r := range rs {
		q.fillRequest(&req, s, qkey)
		req.from, req.fromGID, req.toGID = ctx.addr, ctx.gid(), s.ah.group
		q.wdata.reset(w, s.inline, s.isInline)
		r.respond(&req, &q.wdata, &q.wresp)
		r.refs.release()
	}
}
