package stream

import (
	"fmt"
	"testing"
)

// ForceHeaderMode makes the streams that t's test opens use header mode
// (ring.go) although their connections have credits, so that the mode
// rdma_cm set-ups need runs on the soft provider too.
func ForceHeaderMode(t testing.TB) {
	SetHeaderMode(true)
	t.Cleanup(func() { SetHeaderMode(false) })
}

// SetHeaderMode is ForceHeaderMode for a test's child process.
func SetHeaderMode(on bool) { forceHeaderMode.Store(on) }

// DebugState describes s's receive side, for a test's failure message.
func DebugState(s *Conn) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf := "nil"
	if s.rf != nil {
		rf = fmt.Sprintf("resolved=%v err=%v", s.rf.Resolved(), s.rf.Err())
	}
	return fmt.Sprintf("rf{%s} rerr=%v serr=%v waiting=%d flushing=%v hdr=%v rcvd=%d read=%d msgs=%d peerTook=%d took=%d sends=%d finOwed=%v credOwed=%v",
		rf, s.rerr, s.serr, s.waiting, s.flushing, s.hdr, s.st.rcvd, s.st.read, s.st.msgs, s.st.peerTook, s.st.took, len(s.sends), s.finOwed, s.credOwed)
}

// WriteBlocked says whether s can stage no more bytes now: a Write
// waits for the peer (its credits, or in header mode its count of
// messages taken) or for its own WRITEs to complete.
func WriteBlocked(s *Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, k := s.st.writable(1)
	return k == 0 && !s.filling && s.st.wsize > 0
}

// StagingSize is the size of s's staging ring (0 before the peer's
// hello).
func StagingSize(s *Conn) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.stageMem)
}
