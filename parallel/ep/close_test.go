package ep_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// rowBufferCounter is a CPU backend that records every allocation made by
// an expert path's persistent row buffers (the caller's frame is
// parallel/ep's rowBuffer.get: the collective dispatcher's send, receive
// and gradient rows, and the shadow's) and each one's frees.
type rowBufferCounter struct {
	*cpu.Backend
	mu    sync.Mutex
	made  int
	live  map[*tensor.Tensor]bool
	freed map[*tensor.Tensor]int
}

func newRowBufferCounter() *rowBufferCounter {
	return &rowBufferCounter{Backend: cpu.New(cpu.WithThreads(1)), live: map[*tensor.Tensor]bool{}, freed: map[*tensor.Tensor]int{}}
}

func (c *rowBufferCounter) Zeros(dt tensor.DType, shape ...int) *tensor.Tensor {
	t := c.Backend.Zeros(dt, shape...)
	pc := make([]uintptr, 1)
	if runtime.Callers(2, pc) == 1 && strings.HasSuffix(runtime.FuncForPC(pc[0]).Name(), "parallel/ep.(*rowBuffer).get") {
		c.mu.Lock()
		c.made++
		c.live[t] = true
		c.mu.Unlock()
	}
	return t
}

func (c *rowBufferCounter) Free(t *tensor.Tensor) {
	c.mu.Lock()
	if _, ok := c.live[t]; ok {
		c.freed[t]++
		c.live[t] = false
	}
	c.mu.Unlock()
	c.Backend.Free(t)
}

// counts is the row buffers made, and an error naming how many were not
// freed exactly once.
func (c *rowBufferCounter) counts() (made int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept, twice := 0, 0
	for t := range c.live {
		switch n := c.freed[t]; {
		case n == 0:
			kept++
		case n > 1:
			twice++
		}
	}
	if kept+twice > 0 {
		err = fmt.Errorf("of %d row buffers made, %d never freed, %d freed more than once", c.made, kept, twice)
	}
	return c.made, err
}

// TestMoECloseFreesExpertPathBuffers: at EP 2, an MoE layer on the
// collective expert path (ep.Dispatcher), and one whose expert path is
// shadowed on every step (the decorator holds a collective dispatcher as
// its reference beside the real path, here the dispatcher again), runs a
// forward and backward, then MoE.Close frees every persistent row buffer
// its expert path allocated, on every rank, exactly once; a second Close
// frees nothing more.
func TestMoECloseFreesExpertPathBuffers(t *testing.T) {
	for _, shadowed := range []bool{false, true} {
		name := "collective"
		if shadowed {
			name = "shadowed"
		}
		t.Run(name, func(t *testing.T) {
			err := local.Run(2, func(c comm.Comm) error {
				b := newRowBufferCounter()
				par := ep.Parallel{Group: c, MaxTokens: 16}
				var sh *overlap.Shadow
				if shadowed {
					var err error
					if sh, err = overlap.NewShadow(overlap.ShadowConfig{Every: 1}, c, b, nil, tensor.Float32); err != nil {
						return err
					}
					if par.Overlap, err = overlap.NewChooser(overlap.Config{Default: "pipelined"}, []overlap.Strategy{hostPath{}}, nil, overlap.WithShadow(sh)); err != nil {
						return err
					}
				}
				ps := layers.NewParamSet(seed)
				m, err := ep.New(b, ps, par, "blocks.1.moe", baseCfg)
				if err != nil {
					return err
				}
				if err := ps.Materialize(b, tensor.Float32); err != nil {
					return err
				}
				n, C := 6+c.Rank(), baseCfg.Dim
				rng := testutil.Rng(uint64(70 + c.Rank()))
				x := upload(b, testutil.RandFloats(rng, n*C, -1, 1), n, C)
				dout := upload(b, testutil.RandFloats(rng, n*C, -1, 1), n, C)
				out, dx := b.Zeros(tensor.Float32, n, C), b.Zeros(tensor.Float32, n, C)
				if sh != nil {
					sh.BeginStep(1)
				}
				if err := m.Forward(out, x); err != nil {
					return err
				}
				if err := m.Backward(dx, dout); err != nil {
					return err
				}
				if sh != nil {
					if _, err := sh.EndStep(1); err != nil {
						return err
					}
				}
				if err := m.Close(); err != nil {
					return fmt.Errorf("rank %d: Close: %w", c.Rank(), err)
				}
				made, err := b.counts()
				if err != nil {
					return fmt.Errorf("rank %d: after Close: %w", c.Rank(), err)
				}
				// The dispatcher's six (send, receive, back, their gradients,
				// dy), each allocated by the step; the shadowed run's
				// reference has its own six (and the decorator some).
				if least := map[bool]int{false: 6, true: 12}[shadowed]; made < least {
					return fmt.Errorf("rank %d: %d row buffers made, expected at least %d: the step did not run the path it names", c.Rank(), made, least)
				}
				if err := m.Close(); err != nil {
					return fmt.Errorf("rank %d: second Close: %v, want nil", c.Rank(), err)
				}
				if _, err := b.counts(); err != nil {
					return fmt.Errorf("rank %d: after a second Close: %w", c.Rank(), err)
				}
				return b.Err()
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
