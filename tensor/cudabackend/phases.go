package cudabackend

import (
	"errors"
	"fmt"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// Phase timing without a profiler: nsys could not make a report on the
// GPU machines at hand, and ncu serialises kernels, which deadlocks the
// fused paths' spinning kernels. Layers mark where their phases
// start (tensor.MarkPhase); while a PhaseTimes runs, each mark records a
// timing event on the backend's stream, and the time between two marks —
// every kernel, copy and wait queued between them, and the gaps — is the
// earlier mark's phase. Work on other streams (a fused path's side
// stream) shows only where the backend's stream waits for it.

// Phase is one phase's share of a PhaseTimes run.
type Phase struct {
	Name  string
	Total time.Duration // summed over its occurrences
	Count int           // how often it was marked
}

// PhaseTimes is a running phase timer (StartPhases).
type PhaseTimes struct {
	b     *Backend
	names []string
	evs   []*cuda.Event // on a GPU: one timing event per mark
	host  []time.Time   // on the emulator, whose kernels run as they are queued: the host clock
}

// StartPhases starts timing the phases marked on b's stream (the first
// phase, until the first mark, is "(start)"); Stop ends it. One runs at a
// time per backend.
func (b *Backend) StartPhases() (*PhaseTimes, error) {
	p := &PhaseTimes{b: b}
	b.mu.Lock()
	busy := b.phases != nil
	if !busy {
		b.phases = p
	}
	b.mu.Unlock()
	if busy {
		return nil, errors.New("cuda: StartPhases: a phase timer already runs on this backend, expected its Stop first")
	}
	b.MarkPhase("(start)")
	if err := b.Err(); err != nil {
		p.release()
		return nil, err
	}
	return p, nil
}

// MarkPhase implements tensor.PhaseMarker: phase name starts here in the
// stream's order. Without a running PhaseTimes it does nothing.
func (b *Backend) MarkPhase(name string) {
	b.mu.Lock()
	idle := b.phases == nil
	b.mu.Unlock()
	if idle { // the common case: no device call at all
		return
	}
	b.do("MarkPhase", func(d gpu.Device) error {
		p := b.phases
		if p == nil {
			return nil
		}
		if cd, ok := d.(*cudaDevice); ok {
			ev, err := cuda.NewEvent(true)
			if err != nil {
				return err
			}
			if err := ev.Record(cd.stream); err != nil {
				_ = ev.Destroy()
				return err
			}
			p.evs = append(p.evs, ev)
		} else {
			p.host = append(p.host, time.Now())
		}
		p.names = append(p.names, name)
		return nil
	})
}

// Stop ends the run: it marks its end, waits for the stream, and returns
// each phase's total time and count, in the order the phases were first
// marked. The timer cannot be used again.
func (p *PhaseTimes) Stop() ([]Phase, error) {
	b := p.b
	b.MarkPhase("(end)")
	err := b.Sync()
	var out []Phase
	if err == nil {
		out, err = p.totals()
	}
	p.release()
	if err != nil {
		return nil, fmt.Errorf("cuda: PhaseTimes.Stop: %w", err)
	}
	return out, nil
}

func (p *PhaseTimes) totals() ([]Phase, error) {
	n := len(p.names)
	var span func(i int) (time.Duration, error) // mark i to mark i+1
	switch {
	case len(p.evs) == n:
		span = func(i int) (time.Duration, error) { return cuda.Elapsed(p.evs[i], p.evs[i+1]) }
	case len(p.host) == n:
		span = func(i int) (time.Duration, error) { return p.host[i+1].Sub(p.host[i]), nil }
	default:
		return nil, fmt.Errorf("%d marks with %d events and %d host times, expected one of them per mark (a mark failed?)", n, len(p.evs), len(p.host))
	}
	at := map[string]int{}
	var out []Phase
	for i := 0; i+1 < n; i++ {
		d, err := span(i)
		if err != nil {
			return nil, err
		}
		j, ok := at[p.names[i]]
		if !ok {
			j = len(out)
			at[p.names[i]] = j
			out = append(out, Phase{Name: p.names[i]})
		}
		out[j].Total += d
		out[j].Count++
	}
	return out, nil
}

// release detaches the timer from its backend and frees its events.
func (p *PhaseTimes) release() {
	b := p.b
	_ = b.OnDevice(func(*cuda.Stream) error {
		destroyEvents(p.evs...)
		return nil
	})
	b.mu.Lock()
	if b.phases == p {
		b.phases = nil
	}
	b.mu.Unlock()
	p.evs, p.host, p.names = nil, nil, nil
}

var _ tensor.PhaseMarker = (*Backend)(nil)
