package grads_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// countingStreams is inlineStreams that records the streams it makes and
// destroys.
type countingStreams struct {
	*cpu.Backend
	mu        sync.Mutex
	made      []string
	destroyed map[string]int
}

func (s *countingStreams) NewStream() (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := fmt.Sprintf("side %d", len(s.made))
	s.made = append(s.made, name)
	return name, nil
}

func (s *countingStreams) StreamWait(_, _ any) error { return nil }

func (s *countingStreams) DestroyStream(st any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.destroyed[st.(string)]++
	return nil
}

// waitedWork is a Work that counts its waits, after a pause.
type waitedWork struct {
	comm.Work
	n *atomic.Int32
}

func (w waitedWork) Wait(s comm.Stream) error {
	time.Sleep(time.Millisecond)
	err := w.Work.Wait(s)
	w.n.Add(1)
	return err
}

// leaks says which streams made were not destroyed exactly once.
func (s *countingStreams) leaks() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range s.made {
		if n := s.destroyed[name]; n != 1 {
			return fmt.Errorf("stream %q destroyed %d times, expected once (streams made: %v)", name, n, s.made)
		}
	}
	if len(s.destroyed) != len(s.made) {
		return fmt.Errorf("destroyed %v, made %v", s.destroyed, s.made)
	}
	return nil
}

// TestReducerClose: on a grid of DP 2 × TP 2 with EP 2 and a distributed
// optimizer's Reducer, with side streams (counted) and on the CPU's
// goroutines, Close waits for the parameters' all-gathers in flight
// (every rank's parameters are then their owners' parts), releases each
// side stream it made exactly once (the sums' and the all-gathers'),
// does nothing the second time, and BeginBackward and GatherParams then
// refuse naming Close. A Reducer closed in the middle of a backward
// whose sums have started waits for them (the peers' collectives match)
// and releases its stream too.
func TestReducerClose(t *testing.T) {
	for _, streams := range []bool{true, false} {
		t.Run(fmt.Sprintf("streams=%v", streams), func(t *testing.T) {
			err := local.Run(4, func(c comm.Comm) error {
				grid, err := comm.NewGrid(c, 2, 2, 2)
				if err != nil {
					return err
				}
				defer grid.Close()
				cs := &countingStreams{Backend: cpu.New(cpu.WithThreads(1)), destroyed: map[string]int{}}
				var b tensor.Backend = cs.Backend
				if streams {
					b = cs
				}
				tpr, epr := grid.TPGroup.Rank(), grid.EPGroup.Rank()
				ps, shards := build(t, b, tpr, epr, tensor.Float32)
				for i, s := range shards {
					h, _ := tensor.FromFloat64(gradOf(c.Rank(), i, s.Param.Numel()), s.Param.Shape()...)
					b.Upload(s.Param.G, h)
				}
				red, err := grads.NewReducerWith(b, ps, shards, grads.GridGroups(grid, nil), grads.Config{BucketBytes: 28, Shard: true})
				if err != nil {
					return err
				}
				if err := red.Reduce(); err != nil {
					return err
				}
				sh, _ := red.Sharding()
				w, _ := ps.Flat()
				vals := testutil.Download(b, w)
				owner := func(i int) float64 { return float64(i + 1000*tpr + 100*epr) }
				for i := range vals {
					vals[i] = -1
				}
				for _, rg := range sh.Ranges {
					for i := rg.Lo; i < rg.Hi; i++ {
						vals[i] = owner(i)
					}
				}
				h, _ := tensor.FromFloat64(vals, len(vals))
				b.Upload(w, h)
				if err := red.GatherParams(); err != nil {
					return err
				}
				if err := red.Close(); err != nil {
					return fmt.Errorf("Close with the all-gathers in flight: %w", err)
				}
				for i, v := range testutil.Download(b, w) {
					if v != owner(i) {
						return fmt.Errorf("rank %d: parameter element %d is %v after Close, expected its owner's %v", c.Rank(), i, v, owner(i))
					}
				}
				if streams && len(cs.made) != 2 {
					return fmt.Errorf("%d side streams made, expected 2 (the sums' and the all-gathers')", len(cs.made))
				}
				if err := cs.leaks(); err != nil {
					return err
				}
				if err := red.Close(); err != nil {
					return fmt.Errorf("second Close: %w", err)
				}
				if err := cs.leaks(); err != nil {
					return fmt.Errorf("after the second Close: %w", err)
				}
				if err := red.BeginBackward(0, 1); err == nil || !strings.Contains(err.Error(), "closed Reducer") {
					return fmt.Errorf("BeginBackward after Close: %v, expected a refusal naming the closed Reducer", err)
				}
				if err := red.GatherParams(); err == nil || !strings.Contains(err.Error(), "closed Reducer") {
					return fmt.Errorf("GatherParams after Close: %v, expected a refusal naming the closed Reducer", err)
				}

				// Closed in the middle of a backward whose sums started:
				// each sum's Work records that it was waited for (after a
				// pause, so that a CPU lane left running would not have).
				var started, waited atomic.Int32
				mid, err := grads.NewReducerWith(b, ps, shards, grads.GridGroups(grid, nil), grads.Config{BucketBytes: 28,
					ReduceBucket: func(bkt grads.Bucket, buf *tensor.Tensor, s comm.Stream) (comm.Work, error) {
						started.Add(1)
						w, err := bkt.Group.AllReduce(buf, comm.Sum, s)
						return waitedWork{w, &waited}, err
					}})
				if err != nil {
					return err
				}
				if err := mid.BeginBackward(0, 1); err != nil {
					return err
				}
				if err := mid.Ready(ps.Params()); err != nil {
					return err
				}
				if err := mid.Close(); err != nil {
					return fmt.Errorf("Close in a backward: %w", err)
				}
				if n, m := started.Load(), waited.Load(); n == 0 || m != n {
					return fmt.Errorf("rank %d: %d sums started, %d waited for by Close, expected all of at least one", c.Rank(), n, m)
				}
				if streams && len(cs.made) != 3 {
					return fmt.Errorf("%d side streams made, expected 3", len(cs.made))
				}
				return cs.leaks()
			}, local.WithTimeout(20*time.Second))
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
