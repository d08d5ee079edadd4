package stream

import (
	"fmt"
	"slices"
	"testing"

	"github.com/go-rdma/rdma"
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
	send := "none"
	if len(s.sends) > 0 {
		f := s.sends[0].f
		send = fmt.Sprintf("resolved=%v err=%v end=%d", f.Resolved(), f.Err(), s.sends[0].end)
	}
	_, w := s.st.writable(1)
	return fmt.Sprintf("rf{%s} sends[0]{%s} rerr=%v serr=%v waiting=%d flushing=%v hdr=%v rcvd=%d read=%d msgs=%d peerTook=%d took=%d sends=%d finOwed=%v credOwed=%v filling=%v writable=%d queued=%d sent=%d completed=%d",
		rf, send, s.rerr, s.serr, s.waiting, s.flushing, s.hdr, s.st.rcvd, s.st.read, s.st.msgs, s.st.peerTook, s.st.took, len(s.sends), s.finOwed, s.credOwed, s.filling, w, s.st.queued, s.st.sent, s.st.completed)
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

// HoldInFlight makes f the oldest of s's messages in flight, one that
// carries no bytes: until f resolves, s reaps none of its messages, as
// if the WRITEs it posted had not completed.
func HoldInFlight(s *Conn, f *rdma.Future) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sends = slices.Insert(s.sends, 0, sendRec{f: f, end: s.st.completed})
}

// InFlight reaps s's completed messages and counts those still in
// flight.
func InFlight(s *Conn) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reapLocked()
	return len(s.sends)
}

// Corked is how many bytes s has queued in staging and not posted, and
// whether its flusher (which posts them later) runs.
func Corked(s *Conn) (n int, flushing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.st.queued - s.st.sent), s.flushing
}

// Cork is how many bytes may gather in s's staging behind a WRITE in
// flight before they go out without waiting for it.
func Cork(s *Conn) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.cork()
}

// HeaderWindow is, in header mode, how many messages s sent, how many of
// them the peer said it took (once s took what arrived), and the peer's
// receive window.
func HeaderWindow(s *Conn) (msgs, peerTook, window int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pumpLocked()
	return int(s.st.msgs), int(s.st.peerTook), int(s.st.window)
}
