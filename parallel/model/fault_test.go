package model_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// faultyBackend fails its failAt-th MatMul (a sticky error, like a GPU
// kernel that faults) and does nothing afterwards.
type faultyBackend struct {
	tensor.Backend
	mu              sync.Mutex
	matmuls, failAt int
	err             error
}

func (f *faultyBackend) MatMul(c, a, b *tensor.Tensor, transA, transB bool, alpha, beta float32) {
	f.mu.Lock()
	f.matmuls++
	if f.matmuls == f.failAt && f.err == nil {
		f.err = fmt.Errorf("injected fault in MatMul #%d", f.failAt)
	}
	failed := f.err != nil
	f.mu.Unlock()
	if !failed {
		f.Backend.MatMul(c, a, b, transA, transB, alpha, beta)
	}
}

func (f *faultyBackend) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	return f.Backend.Err()
}

func (f *faultyBackend) Sync() error { return f.Err() }

// runWorld drives the ranks of a local world without local.Run (so nothing
// but the model aborts on a failure) and returns each rank's error.
func runWorld(n int, timeout time.Duration, fn func(c comm.Comm) error) []error {
	ranks := local.NewWorld(n, local.WithTimeout(timeout))
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range ranks {
		wg.Go(func() { errs[r] = fn(c) })
	}
	wg.Wait()
	for _, c := range ranks {
		c.Close()
	}
	return errs
}

// A rank whose backend fails in the middle of a step makes every other rank
// fail promptly (well within the deadline) with an error naming it.
func TestRankFailureMidStep(t *testing.T) {
	cfg := smallConfig()
	ids, targets := batch(3, 4, 8, cfg.Vocab)
	const deadline = 20 * time.Second
	for _, failAt := range []int{7, 40} { // in the forward, in the backward
		t.Run(fmt.Sprint("matmul=", failAt), func(t *testing.T) {
			start := time.Now()
			errs := runWorld(4, deadline, func(c comm.Comm) error {
				var b tensor.Backend = cpu.New(cpu.WithThreads(1))
				if c.Rank() == 1 {
					b = &faultyBackend{Backend: b, failAt: failAt}
				}
				g, err := comm.NewGrid(c, 2, 2, 1)
				if err != nil {
					return err
				}
				m, err := model.New(b, g, cfg, model.Options{SequenceParallel: true}, tensor.Float32)
				if err != nil {
					return err
				}
				for range 3 {
					m.ZeroGrad()
					if _, err := m.Forward(ids, targets); err != nil {
						return err
					}
					if err := m.Backward(); err != nil {
						return err
					}
					if _, err := m.GradSumSquares(); err != nil {
						return err
					}
				}
				return nil
			})
			if took := time.Since(start); took > deadline/4 {
				t.Fatalf("the ranks took %v to fail, expected them to stop promptly (deadline %v)", took, deadline)
			}
			if errs[1] == nil || !strings.Contains(errs[1].Error(), "injected fault") {
				t.Fatalf("rank 1: error %v, want the injected fault", errs[1])
			}
			for r, err := range errs {
				if r == 1 {
					continue
				}
				if err == nil || !errors.Is(err, comm.ErrAborted) || !strings.Contains(err.Error(), "world rank 1") {
					t.Fatalf("rank %d: error %v, want an abort naming world rank 1", r, err)
				}
			}
		})
	}
}

// A rank that silently stops (dies without aborting) makes the others fail
// at the deadline with an error naming it, instead of hanging.
func TestRankVanishes(t *testing.T) {
	cfg := smallConfig()
	ids, targets := batch(3, 4, 8, cfg.Vocab)
	errs := runWorld(2, time.Second, func(c comm.Comm) error {
		g, err := comm.NewGrid(c, 1, 2, 1)
		if err != nil {
			return err
		}
		m, err := model.New(cpu.New(cpu.WithThreads(1)), g, cfg, model.Options{}, tensor.Float32)
		if err != nil || c.Rank() == 1 {
			return err // rank 1 never runs the step
		}
		_, err = m.Forward(ids, targets)
		return err
	})
	if errs[0] == nil || !errors.Is(errs[0], comm.ErrTimeout) || !strings.Contains(errs[0].Error(), "rank 1") {
		t.Fatalf("rank 0: error %v, want a timeout naming rank 1", errs[0])
	}
}
