package rdma

import (
	"github.com/go-rdma/rdma/internal/verbs"
)

// shell is a connection as its rc.Conn sees the API (rc.Shell): the
// counting and logging of its end, the public error of a failed
// completion, its RecvHandler and its retirement into the engine's
// counters. A type of its own, so that these methods stay out of Conn's
// API.
type shell conn

// Connected counts and logs a connection that is up.
func (s *shell) Connected() { (*conn)(s).logConnected() }

// Ended counts and logs the end of the connection, with its first
// error.
func (s *shell) Ended(err error) {
	c := (*conn)(s)
	c.eng.lifecycle.ended(c, err)
	c.logEnded(err)
}

// CompletionError is the *CompletionError of a failed completion.
func (s *shell) CompletionError(wc *verbs.WorkCompletion) error {
	var err error = completionError(wc) // never nil
	return err
}

// Retire releases what the API made for the connection, once its QP is
// closed and its operations resolved, and folds its counters into the
// engine's.
func (s *shell) Retire() error {
	c := (*conn)(s)
	err := c.closeSettleByte()
	c.eng.retire(c)
	return err
}

// Handle runs on an engine worker: it hands the connection's ready
// messages to its handler, on the application's pool when it gave one
// (WithHandlerPool).
func (s *shell) Handle() {
	c := (*conn)(s)
	if p := c.cfg.handlerPool; p != nil && p.Submit(c.handle) == nil {
		return
	}
	c.handle()
}
