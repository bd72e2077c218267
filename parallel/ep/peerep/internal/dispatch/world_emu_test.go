//go:build asynctp_emu

package dispatch

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The emulated world: P goroutines, each with its own emulated CUDA
// backend. Emulated device memory is host memory, so a rank's symmetric
// buffers are ordinary allocations whose addresses every rank's kernels
// can store into: the peer table is the other ranks' plain addresses. The
// emulator runs a backend's kernels as they are queued, one at a time, so
// no wait kernel may spin on a word that a peer's later kernel would
// write: every rank meets the others at a barrier before each wait
// (Engine.BeforeWait), by which time every rank has run the sends the wait
// is for. Every backend stays open until every rank has returned: a
// peer's kernel may store into a rank's buffers up to its last launch.

// emuDeadline bounds the waits: they never spin while the ranks keep in
// step; a failed rank breaks the barrier, and then its peers' waits give up
// after this instead of hanging the test.
const emuDeadline = 5 * time.Second

// emuRank is one rank of the emulated world: its backend, its engine and
// its symmetric buffers.
type emuRank struct {
	r   int
	b   *cudabackend.Backend
	eng *Engine
	sym [NumBufs]*tensor.Tensor
	bar *emuworld.Barrier
}

// emulated builds an engine of cfg (Rank set per rank, Deadline
// emuDeadline unless set) on each of cfg.Ranks emulated ranks and runs f on
// every rank; a rank's error fails t (after every rank has returned).
func emulated(t *testing.T, cfg Config, f func(rk *emuRank) error) {
	t.Helper()
	P := cfg.Ranks
	if cfg.Deadline == 0 {
		cfg.Deadline = emuDeadline
	}
	bar := emuworld.NewBarrier(P)
	var addrs [NumBufs][]uint64 // every rank's address of each buffer
	for i := range addrs {
		addrs[i] = make([]uint64, P)
	}
	backends := make([]*cudabackend.Backend, P)
	errs := make([]error, P)
	var wg sync.WaitGroup
	for r := range P {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				b, err := cudabackend.NewEmulated()
				if err != nil {
					return err
				}
				backends[r] = b
				rk := &emuRank{r: r, b: b, bar: bar}
				c := cfg
				c.Rank = r
				for i, s := range SymmetricShapes(c) {
					rk.sym[i] = b.Zeros(s.DType, s.Shape...)
					addrs[i][r] = cudabackend.DevicePtr(rk.sym[i]) // each rank its own column
				}
				if err := b.Sync(); err != nil {
					return err
				}
				bar.Wait() // every rank's addresses are in the table
				if rk.eng, err = New(b, c, rk.sym, addrs); err != nil {
					return err
				}
				rk.eng.BeforeWait = bar.Wait
				if err := b.Sync(); err != nil {
					return err
				}
				bar.Wait() // every rank's signals are zero before any rank signals
				return f(rk)
			}()
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				bar.Break()
			}
		}()
	}
	wg.Wait()
	for _, b := range backends {
		if b != nil {
			if err := b.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing an emulated rank's backend: %w", err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// upload is a device tensor of dt holding vals (rows, cols).
func upload(b *cudabackend.Backend, dt tensor.DType, vals []float64, shape ...int) *tensor.Tensor {
	h := tensor.MustHost(dt, shape...)
	if err := h.SetFloat64s(vals); err != nil {
		panic(err)
	}
	t := b.Zeros(dt, shape...)
	b.Upload(t, h)
	return t
}

// uploadInts is a device int32 tensor holding vals.
func uploadInts(b *cudabackend.Backend, vals []int32, shape ...int) *tensor.Tensor {
	h, err := tensor.FromInt32(vals, shape...)
	if err != nil {
		panic(err)
	}
	t := b.Zeros(tensor.Int32, shape...)
	b.Upload(t, h)
	return t
}

// poisoned is a device tensor of dt filled with NaN: a value never
// written stays NaN.
func poisoned(b *cudabackend.Backend, dt tensor.DType, shape ...int) *tensor.Tensor {
	n := tensor.Shape(shape).Numel()
	v := make([]float64, n)
	for i := range v {
		v[i] = math.NaN()
	}
	return upload(b, dt, v, shape...)
}

// floats reads a float tensor back (after the queued work).
func floats(b *cudabackend.Backend, t *tensor.Tensor) ([]float64, error) {
	h := tensor.MustHost(tensor.Float64, t.Shape()...)
	b.Download(h, t)
	if err := b.Sync(); err != nil {
		return nil, err
	}
	return h.F64(), nil
}

// ints reads an int32 tensor back (after the queued work).
func ints(b *cudabackend.Backend, t *tensor.Tensor) ([]int32, error) {
	h := tensor.MustHost(tensor.Int32, t.Shape()...)
	b.Download(h, t)
	if err := b.Sync(); err != nil {
		return nil, err
	}
	return h.I32(), nil
}

// u64s reads a tensor of little-endian int32 pairs as 64-bit words.
func u64s(b *cudabackend.Backend, t *tensor.Tensor) ([]uint64, error) {
	v, err := ints(b, t)
	if err != nil {
		return nil, err
	}
	w := make([]uint64, len(v)/2)
	for i := range w {
		w[i] = uint64(uint32(v[2*i])) | uint64(uint32(v[2*i+1]))<<32
	}
	return w, nil
}
