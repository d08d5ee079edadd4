package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws a progress bar with throughput on w: redrawn in place
// at most 5 times a second on a terminal, a line a second otherwise. A
// nil w draws nothing.
type progress struct {
	w     io.Writer
	tty   bool
	label string
	total int64
	start time.Time
	done  atomic.Int64

	quit     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once
}

func startProgress(w io.Writer, tty bool, label string, total int64) *progress {
	p := &progress{w: w, tty: tty, label: label, total: total, start: time.Now(),
		quit: make(chan struct{}), stopped: make(chan struct{})}
	if w == nil {
		close(p.stopped)
		return p
	}
	every := time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(false)
			case <-p.quit:
				p.draw(true)
				return
			}
		}
	}()
	return p
}

// add counts n more bytes done.
func (p *progress) add(n int64) { p.done.Add(n) }

// stop draws the final state and ends the drawing goroutine.
func (p *progress) stop() {
	p.stopOnce.Do(func() { close(p.quit) })
	<-p.stopped
}

func (p *progress) draw(last bool) {
	done, el := p.done.Load(), time.Since(p.start)
	frac := 1.0
	if p.total > 0 {
		frac = float64(done) / float64(p.total)
	}
	const width = 30
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	eta := ""
	if done > 0 && done < p.total && !last {
		left := time.Duration(float64(el) / float64(done) * float64(p.total-done))
		eta = "  ETA " + left.Round(time.Second).String()
	}
	line := fmt.Sprintf("%s [%s] %3.0f%%  %s / %s  %s%s", p.label, bar, frac*100, human(done), human(p.total), rate(done, el), eta)
	switch {
	case !p.tty:
		fmt.Fprintln(p.w, line)
	case last:
		fmt.Fprintf(p.w, "\r%-90s\n", line)
	default:
		fmt.Fprintf(p.w, "\r%-90s", line)
	}
}
