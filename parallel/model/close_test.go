package model_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// streamCounter is a CPU backend with side streams (tensor.Streams) that
// records the streams made and each one's destructions: the pipelined
// sites' lanes and the gradient reduction's take theirs from it.
type streamCounter struct {
	*cpu.Backend
	mu        sync.Mutex
	made      int
	destroyed map[string]int
}

type countedStream struct{ name string }

func (s *streamCounter) NewStream() (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.made++
	return &countedStream{fmt.Sprintf("side %d", s.made-1)}, nil
}

func (s *streamCounter) StreamWait(_, _ any) error { return nil }

func (s *streamCounter) DestroyStream(st any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs, ok := st.(*countedStream)
	if !ok {
		return fmt.Errorf("destroy of %T %v, not a stream of this backend", st, st)
	}
	s.destroyed[cs.name]++
	return nil
}

// counts returns the streams made and destroyed so far, and an error
// naming each stream not destroyed exactly once.
func (s *streamCounter) counts() (made, destroyed int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var bad []string
	for i := range s.made {
		name := fmt.Sprintf("side %d", i)
		if n := s.destroyed[name]; n != 1 {
			bad = append(bad, fmt.Sprintf("%s destroyed %d times", name, n))
		}
		destroyed += s.destroyed[name]
	}
	if len(bad) > 0 {
		err = fmt.Errorf("of %d streams made: %s", s.made, strings.Join(bad, ", "))
	}
	return s.made, destroyed, err
}

// sitesOf is the number of communication sites the TP layers of cfg
// build: per block the attention's two (q/k/v entry, wo exit), and the
// MLP's two in a dense block; then the LM head's entry.
func sitesOf(cfg layers.GPTConfig) int {
	n := 1
	for l := range cfg.Layers {
		n += 2
		if !cfg.IsMoE(l) {
			n += 2
		}
	}
	return n
}

// TestModelCloseReleasesSites: at TP 2 (× DP 2, with and without sequence
// parallelism, dense and MoE at EP 2) with the pipelined strategy on every
// site (overlap.Exchange's lanes over the group's collectives, each with
// a side stream of the backend), a step then Model.Close destroys every
// side stream the model made exactly once: the gradient reduction's and
// one per site (as many more than the same model with collective sites
// makes as the layers have sites). A second Close returns nil and
// destroys nothing, and a forward after Close is refused naming Close.
func TestModelCloseReleasesSites(t *testing.T) {
	for _, c := range []struct {
		cfg layers.GPTConfig
		l   layout
	}{
		{smallConfig(), layout{tp: 2, dp: 2, sp: true}},
		{smallConfig(), layout{tp: 2, dp: 2, sp: false}},
		{moeConfig(), layout{tp: 2, dp: 2, ep: 2, sp: true}},
	} {
		name := c.l.String()
		if c.cfg.Experts > 0 {
			name = "moe/" + name
		}
		t.Run(name, func(t *testing.T) {
			ids, targets := batch(5, 4, 8, c.cfg.Vocab)
			made := map[string]int{}
			var mu sync.Mutex
			for _, strategy := range []string{"collective", "pipelined"} {
				l := c.l
				l.overlap = strategy
				err := onGrid(l, func(_ tensor.Backend, g *comm.Grid) error {
					sc := &streamCounter{Backend: cpu.New(cpu.WithThreads(1)), destroyed: map[string]int{}}
					m, err := newModel(sc, g, c.cfg, l, tensor.Float32)
					if err != nil {
						return err
					}
					if err := m.ForwardBackward(ids, targets); err != nil {
						return err
					}
					if _, err := m.ReadLoss(); err != nil {
						return err
					}
					if err := m.Close(); err != nil {
						return fmt.Errorf("Close: %w", err)
					}
					n, destroyed, err := sc.counts()
					if err != nil {
						return fmt.Errorf("%s: after Close: %w", strategy, err)
					}
					if err := m.Close(); err != nil {
						return fmt.Errorf("second Close: %v, want nil", err)
					}
					if _, again, _ := sc.counts(); again != destroyed {
						return fmt.Errorf("second Close destroyed %d more streams, want none", again-destroyed)
					}
					if _, err := m.Forward(ids, targets); err == nil || !strings.Contains(err.Error(), "closed") {
						return fmt.Errorf("Forward after Close: %v, want a refusal naming Close", err)
					}
					if g.World.Rank() == 0 {
						mu.Lock()
						made[strategy] = n
						mu.Unlock()
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if got, want := made["pipelined"]-made["collective"], sitesOf(c.cfg); got != want {
				t.Fatalf("pipelined made %d side streams, collective %d: %d for the sites, want one per site (%d)",
					made["pipelined"], made["collective"], got, want)
			}
		})
	}
}
