//go:build asynctp_emu

package peerep

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The emulated ranks: goroutines over comm/local, each with its own
// emulated CUDA backend. Emulated device memory is host memory, so a
// symmetric allocation is one ordinary allocation per rank whose
// addresses every rank can store into: the "peer pointers" are the other
// ranks' plain buffers. The emulator runs one kernel at a time, so a wait
// kernel must never spin on a word that another rank's later kernel would
// write: every rank passes a barrier before each wait (WithBeforeWait),
// by which time every rank has run the sends the wait is for.

// registry is the emulated world's shared state: the table of the ranks'
// symmetric allocations, and the ranks' backends, kept open until every
// rank has returned (keep, closeAll).
type registry struct {
	mu    sync.Mutex
	addrs map[int][]uint64 // allocation number → each rank's address
	open  []*cudabackend.Backend
}

func newRegistry() *registry { return &registry{addrs: map[int][]uint64{}} }

// keep holds a rank's backend open until closeAll. A rank's emulated
// device memory is host memory that its peers' kernels store into up to
// their last launch (the acks of the last step, the signals of a failed
// one): a rank that closed its backend when its own work ended would free
// memory that a slower peer's kernel then writes, corrupting the C heap.
// On GPUs the symmetric heap outlives the world's kernels the same way
// (FreeSymmetric is collective).
func (r *registry) keep(b *cudabackend.Backend) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open = append(r.open, b)
}

// closeAll closes the backends of keep; call it after local.Run, which
// returns once every rank has.
func (r *registry) closeAll(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	open := r.open
	r.open = nil
	r.mu.Unlock()
	for _, b := range open {
		if err := b.Close(); err != nil {
			t.Errorf("closing an emulated rank's backend: %v", err)
		}
	}
}

// symComm is a rank's world with symmetric memory over the registry; its
// all-reduces of device tensors go through host copies (comm/local moves
// host tensors only).
type symComm struct {
	comm.Comm
	b    *cudabackend.Backend
	reg  *registry
	seq  int
	mine map[uint64]symAlloc // own base address → allocation
}

// symAlloc is a rank's symmetric allocation: its number in the registry,
// and the tensor, held until FreeSymmetric so that its block is not
// recycled (the backend's cleanup of unreachable buffers) while peers
// still hold its address.
type symAlloc struct {
	n int
	t *tensor.Tensor
}

func newSymComm(world comm.Comm, b *cudabackend.Backend, reg *registry) *symComm {
	return &symComm{Comm: world, b: b, reg: reg, mine: map[uint64]symAlloc{}}
}

func (c *symComm) Unwrap() comm.Comm { return c.Comm }

func (c *symComm) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	t := c.b.Zeros(dt, shape...)
	if err := c.b.Sync(); err != nil {
		return nil, err
	}
	n, a := c.seq, cudabackend.DevicePtr(t)
	c.seq++
	c.reg.mu.Lock()
	if c.reg.addrs[n] == nil {
		c.reg.addrs[n] = make([]uint64, c.Size())
	}
	c.reg.addrs[n][c.Rank()] = a
	c.reg.mu.Unlock()
	c.mine[a] = symAlloc{n, t}
	return t, c.Barrier() // every rank has registered it
}

// FreeSymmetric is collective, as on GPUs: a rank gives its copy back
// only once every rank has reached the call, when no peer's kernel (each
// runs to completion in the emulator) is left to store into it.
func (c *symComm) FreeSymmetric(t *tensor.Tensor) error {
	a := cudabackend.DevicePtr(t)
	if _, ok := c.mine[a]; !ok {
		return fmt.Errorf("free of %v: not a symmetric allocation of this rank", t)
	}
	if err := c.Barrier(); err != nil {
		return err
	}
	delete(c.mine, a)
	c.b.Free(t)
	return c.b.Err()
}

func (c *symComm) PeerPtr(t *tensor.Tensor, r int) (uint64, error) {
	s, ok := c.mine[cudabackend.DevicePtr(t)]
	if !ok {
		return 0, fmt.Errorf("not a symmetric allocation")
	}
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.reg.addrs[s.n][r], nil
}

func (c *symComm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	if buf.Device().Kind == tensor.CPU {
		return c.Comm.AllReduce(buf, op, s)
	}
	h := tensor.MustHost(buf.DType(), buf.Shape()...)
	c.b.Download(h, buf)
	if err := c.b.Sync(); err != nil {
		return nil, err
	}
	w, err := c.Comm.AllReduce(h, op, nil)
	if err == nil {
		err = w.Wait(nil)
	}
	if err != nil {
		return nil, err
	}
	c.b.Upload(buf, h)
	return comm.Done, c.b.Err()
}

// barrier is a reusable barrier of n goroutines.
type barrier struct {
	mu         sync.Mutex
	cond       *sync.Cond
	n, waiting int
	gen        int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.gen
	b.waiting++
	if b.waiting == b.n {
		b.waiting, b.gen = 0, b.gen+1
		b.cond.Broadcast()
		return
	}
	for g == b.gen {
		b.cond.Wait()
	}
}

// emulated runs f on P goroutine ranks, each with an emulated backend and
// a world with symmetric memory; bar is their wait barrier.
func emulated(t *testing.T, P int, f func(c *symComm, bar *barrier) error) {
	t.Helper()
	reg := newRegistry()
	defer reg.closeAll(t)
	bar := newBarrier(P)
	err := local.Run(P, func(world comm.Comm) error {
		b, err := cudabackend.NewEmulated()
		if err != nil {
			return err
		}
		reg.keep(b)
		return f(newSymComm(world, b, reg), bar)
	}, local.WithTimeout(120*time.Second))
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
				emulated(t, P, func(c *symComm, bar *barrier) error {
					r := eptest.Rank{Group: c, Backend: c.b, Stream: c.b.Stream(), DType: dt, Seed: uint64(17 + P), Logf: t.Logf,
						NewPath: func(cfg eptest.Config) (ep.ExpertPath, error) {
							return New(ep.ExpertConfig{Name: "moe", Backend: cfg.Backend, Stream: cfg.Stream, Group: cfg.Group,
								Tokens: cfg.Tokens, Experts: cfg.Experts, Cols: cfg.Cols, MaxTokens: cfg.MaxTokens},
								WithBeforeWait(bar.wait))
						}}
					if err := r.CheckAll(); err != nil {
						return err
					}
					return c.b.Sync()
				})
			})
		}
	}
}

// TestEmuDeadline: rank 1 never dispatches; rank 0's wait for its tokens
// runs out and the error names rank 1.
func TestEmuDeadline(t *testing.T) {
	emulated(t, 2, func(c *symComm, bar *barrier) error {
		p, err := New(ep.ExpertConfig{Name: "moe", Backend: c.b, Group: c, Experts: 2, Cols: 4, MaxTokens: 4},
			WithDeadline(50*time.Millisecond))
		if err != nil {
			return err
		}
		l, err := p.Layout([]int32{0, 1}, 2, 1, 0)
		if err != nil {
			return err
		}
		x := c.b.Zeros(tensor.Float32, 2, 4)
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
