//go:build asynctp_emu

package emuworld

import "sync"

// Barrier is a reusable barrier of n goroutines: the emulator runs one
// kernel at a time, so a rank waits for its peers' sends before its wait
// kernel (peerep.WithBeforeWait(bar.Wait)). Once broken (a rank failed)
// it lets everyone through.
type Barrier struct {
	mu         sync.Mutex
	cond       *sync.Cond
	n, waiting int
	gen        int
	broken     bool
}

// NewBarrier is a barrier of n goroutines.
func NewBarrier(n int) *Barrier {
	b := &Barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Wait returns once n goroutines have called it (since the last release),
// or at once when the barrier is broken.
func (b *Barrier) Wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken {
		return
	}
	g := b.gen
	b.waiting++
	if b.waiting == b.n {
		b.waiting, b.gen = 0, b.gen+1
		b.cond.Broadcast()
		return
	}
	for g == b.gen && !b.broken {
		b.cond.Wait()
	}
}

// Break lets every goroutine through, those waiting and those to come: a
// rank that failed will not reach the barrier, and its peers must not wait
// for it.
func (b *Barrier) Break() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.broken = true
	b.cond.Broadcast()
}
