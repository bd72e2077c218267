//go:build asynctp_emu

package peerep

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The emulated ranks (internal/testing/emuworld): goroutines over
// comm/local, each with its own emulated CUDA backend and a world with
// symmetric memory; every rank passes a barrier before each wait
// (WithBeforeWait), as the emulator runs one kernel at a time.

// newSymComm is a rank's world with symmetric memory over reg on b, its
// collectives of device tensors staged through the host.
func newSymComm(world comm.Comm, b *cudabackend.Backend, reg *emuworld.Registry) *emuworld.Sym {
	return emuworld.NewSym(emuworld.Staged{Comm: world, B: b}, b, reg, nil)
}

// deviceStrategy is a strategy of the expert path under test, built per
// rank with the ranks' wait barrier (nil: the collective dispatcher).
type deviceStrategy struct {
	name string
	st   func(bar *emuworld.Barrier) overlap.Strategy
}

// deviceStrategies are the strategies of the device step: pipelined and
// fused (stream hooks).
var deviceStrategies = []deviceStrategy{
	{"pipelined", func(bar *emuworld.Barrier) overlap.Strategy { return pipelinedStrategy(WithBeforeWait(bar.Wait)) }},
	{"fused", func(bar *emuworld.Barrier) overlap.Strategy {
		return fusedStrategy(WithBeforeWait(bar.Wait), WithStreamHooks())
	}},
}

// emulated runs f on P goroutine ranks, each with an emulated backend and
// a world with symmetric memory; bar is their wait barrier.
func emulated(t *testing.T, P int, f func(c *emuworld.Sym, bar *emuworld.Barrier) error) {
	t.Helper()
	emulatedWith(t, P, 120*time.Second, nil, f)
}

// emulatedWith is emulated with the backends' options and the ranks'
// deadline.
func emulatedWith(t *testing.T, P int, timeout time.Duration, opts []cudabackend.Option, f func(c *emuworld.Sym, bar *emuworld.Barrier) error) {
	t.Helper()
	reg := emuworld.NewRegistry()
	defer reg.CloseAll(t)
	bar := emuworld.NewBarrier(P)
	err := local.Run(P, func(world comm.Comm) error {
		b, err := cudabackend.NewEmulated(opts...)
		if err != nil {
			return err
		}
		reg.Keep(b)
		return f(newSymComm(world, b, reg), bar)
	}, local.WithTimeout(timeout))
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmuConformance runs the ExpertPath conformance suite (every
// scenario: dropless and capacity drops, top-1/2/8, starved experts, an
// empty rank, ranks with no tokens, determinism over repeats, the
// max-tokens refusal) on the pipelined path over emulated ranks, EP 1, 2,
// 3 and 4, bf16 and f32.
func TestEmuConformance(t *testing.T) {
	for _, P := range []int{1, 2, 3, 4} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("ep=%d/%v", P, dt), func(t *testing.T) {
				emulated(t, P, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
					r := eptest.Rank{Group: c, Backend: c.B, Stream: c.B.Stream(), DType: dt, Seed: uint64(17 + P), Logf: t.Logf,
						NewPath: func(cfg eptest.Config) (ep.ExpertPath, error) {
							return New(ep.ExpertConfig{Name: "moe", Backend: cfg.Backend, Stream: cfg.Stream, Group: cfg.Group,
								Tokens: cfg.Tokens, Experts: cfg.Experts, Cols: cfg.Cols, MaxTokens: cfg.MaxTokens},
								WithBeforeWait(bar.Wait))
						}}
					if err := r.CheckAll(); err != nil {
						return err
					}
					return c.B.Sync()
				})
			})
		}
	}
}

// TestEmuDeadline: rank 1 never dispatches; rank 0's wait for its tokens
// runs out and the error names rank 1.
func TestEmuDeadline(t *testing.T) {
	emulated(t, 2, func(c *emuworld.Sym, bar *emuworld.Barrier) error {
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.B, Group: c, Experts: 2, Cols: 4, MaxTokens: 4},
			WithDeadline(50*time.Millisecond))
		if err != nil {
			return err
		}
		l, err := p.Layout([]int32{0, 1}, 2, 1, 0)
		if err != nil {
			return err
		}
		x := c.B.Zeros(tensor.Float32, 2, 4)
		if c.Rank() == 1 {
			// Allocate with rank 0 (collective), then stay silent.
			if err := p.ensure(1, 4, tensor.Float32); err != nil {
				return err
			}
			return c.Barrier()
		}
		_, _, _, err = p.Dispatch(x, l)
		if err == nil || !strings.Contains(err.Error(), "rank 1 never signalled") {
			return fmt.Errorf("a dispatch whose peer never sends: %v, expected an error naming rank 1", err)
		}
		if _, _, _, err2 := p.Dispatch(x, l); err2 == nil || !errors.Is(err2, p.broken) {
			return fmt.Errorf("the dispatch after a missed deadline: %v, expected the first failure", err2)
		}
		t.Logf("rank 0: %v", err)
		return c.Barrier()
	})
}
