package engine

import "runtime"

// The engine's workers run handlers (an endpoint's message handler),
// never on a poller. A worker starts when handlers wait and fewer than the
// bound run, and exits when none wait, so an idle engine runs no worker:
// importing the library starts nothing.

// Dispatch queues h for a worker, and starts one if fewer than the
// engine's bound run. The queue is bounded by its callers (an endpoint
// is in it at most once), so it never blocks the poller that calls it.
func (e *Engine) Dispatch(h Handler) {
	e.dmu.Lock()
	e.runq.Push(h)
	if e.maxWorkers == 0 {
		// Here rather than at Open: GOMAXPROCS takes the scheduler's
		// lock, and most engines have no handler.
		e.maxWorkers = e.Cfg.HandlerWorkers
		if e.maxWorkers == 0 {
			e.maxWorkers = 4 * runtime.GOMAXPROCS(0)
		}
	}
	if e.workers < e.maxWorkers {
		e.workers++
		e.dwg.Add(1)
		go e.worker()
	}
	e.dmu.Unlock()
}

// worker runs the queued handlers until the queue is empty, then exits.
func (e *Engine) worker() {
	defer e.dwg.Done()
	for {
		e.dmu.Lock()
		if e.runq.Len() == 0 {
			e.workers--
			e.dmu.Unlock()
			return
		}
		h := e.runq.Pop()
		e.dmu.Unlock()
		e.handling.Add(1)
		h.Handle()
		e.handling.Add(-1)
	}
}

// Handling is how many handlers run now.
func (e *Engine) Handling() int64 { return e.handling.Load() }

// stopWorkers waits for the workers to exit: the engine's endpoints are
// closed, so their handlers return at once. When a handler is still
// running (it closed the engine's last endpoint itself, and so runs
// this) it does not wait: the workers exit when their handler returns.
func (e *Engine) stopWorkers() {
	if e.handling.Load() > 0 {
		return
	}
	e.dwg.Wait()
}
