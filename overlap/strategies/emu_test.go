//go:build asynctp_emu

package strategies_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/parallel/ep/peerep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The kernel emulator's ranks are goroutines whose device memory is host
// memory: a symmetric allocation is one allocation per rank, registered so
// that every rank finds the others' (its "peer pointers"). emuSym is that
// symmetric side, on a comm/local world of its own; hosts, when set, puts
// the ranks on hosts that do not reach each other. staged is the
// collective side, another comm/local world whose all-reduces of device
// tensors go through the host (comm/local moves host tensors only).

type allocs struct {
	mu    sync.Mutex
	addrs map[int][]uint64
}

type emuSym struct {
	comm.Comm
	b     *cudabackend.Backend
	reg   *allocs
	seq   int
	mine  map[uint64]int
	hosts []int
}

func (c *emuSym) Reaches(a, b int) bool { return c.hosts == nil || c.hosts[a] == c.hosts[b] }

func (c *emuSym) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
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
	c.mine[a] = n
	return t, c.Barrier()
}

func (c *emuSym) FreeSymmetric(t *tensor.Tensor) error {
	delete(c.mine, cudabackend.DevicePtr(t))
	c.b.Free(t)
	return c.b.Err()
}

func (c *emuSym) PeerPtr(t *tensor.Tensor, r int) (uint64, error) {
	n, ok := c.mine[cudabackend.DevicePtr(t)]
	if !ok {
		return 0, fmt.Errorf("not a symmetric allocation")
	}
	c.reg.mu.Lock()
	defer c.reg.mu.Unlock()
	return c.reg.addrs[n][r], nil
}

type staged struct {
	comm.Comm
	b *cudabackend.Backend
}

func (c staged) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
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

// barrier is a reusable barrier of n goroutines: the emulator runs one
// kernel at a time, so a rank waits for its peers' sends before its wait
// kernel (peerep.WithBeforeWait).
type barrier struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n, in   int
	release int
}

func newBarrier(n int) *barrier { b := &barrier{n: n}; b.cond = sync.NewCond(&b.mu); return b }

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.release
	if b.in++; b.in == b.n {
		b.in, b.release = 0, b.release+1
		b.cond.Broadcast()
		return
	}
	for g == b.release {
		b.cond.Wait()
	}
}

// hybridRanks runs f on P emulated ranks, each with a hybrid group of the
// two worlds.
func hybridRanks(t *testing.T, P int, hosts []int, f func(g comm.Comm, b *cudabackend.Backend, bar *barrier) error) {
	t.Helper()
	coll := local.NewWorld(P, local.WithTimeout(120*time.Second))
	reg := &allocs{addrs: map[int][]uint64{}}
	bar := newBarrier(P)
	err := local.Run(P, func(sym comm.Comm) error {
		b, err := cudabackend.NewEmulated()
		if err != nil {
			return err
		}
		defer b.Close()
		g, err := hybrid.New(staged{coll[sym.Rank()], b}, &emuSym{Comm: sym, b: b, reg: reg, mine: map[uint64]int{}, hosts: hosts})
		if err != nil {
			return err
		}
		return f(g, b, bar)
	}, local.WithTimeout(120*time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

// The registry's pipelined strategy, asked on a hybrid group (collectives
// of one world, symmetric memory of another) whose ranks reach each other,
// builds the peer-copy expert path, which passes the expert path's
// conformance suite (against the float64 reference) at EP 2 and 3; on a
// simulated placement of the ranks on two hosts it refuses, naming the
// ranks it cannot reach.
func TestEmuRegistryOnHybrid(t *testing.T) {
	for _, P := range []int{2, 3} {
		t.Run(fmt.Sprintf("ep=%d", P), func(t *testing.T) {
			hybridRanks(t, P, nil, func(g comm.Comm, b *cudabackend.Backend, bar *barrier) error {
				pipe := strategies.Pipelined{Options: strategies.Options{Expert: []peerep.Option{peerep.WithBeforeWait(bar.wait)}}}
				sp := overlap.Spec{Kind: overlap.KindExpert, Name: "moe", Group: g, Backend: b, Rows: 16, K: 8, Outs: []int{8}, Experts: 2 * P}
				run, not := strategies.Available(sp, []overlap.Strategy{overlap.Collective{}, pipe, strategies.Fused{}})
				if len(run) != 2 || run[1].Name() != "pipelined" {
					return fmt.Errorf("rank %d: the expert site of a hybrid group runs %v (refused: %v), want collective and pipelined", g.Rank(), run, not)
				}
				if how, sym := pipe.Via(sp); !sym {
					return fmt.Errorf("rank %d: the pipelined expert path moves by %q, want symmetric memory", g.Rank(), how)
				}
				r := eptest.Rank{Group: g, Backend: b, Stream: b.Stream(), DType: tensor.Float32, Seed: uint64(31 + P), Logf: t.Logf,
					NewPath: func(cfg eptest.Config) (ep.ExpertPath, error) {
						return pipe.NewExpertPath(ep.ExpertConfig{Name: "moe", Backend: cfg.Backend, Stream: cfg.Stream, Group: cfg.Group,
							Tokens: cfg.Tokens, Experts: cfg.Experts, Cols: cfg.Cols, MaxTokens: cfg.MaxTokens})
					}}
				if err := r.CheckAll(); err != nil {
					return err
				}
				return b.Sync()
			})
		})
	}
	t.Run("two hosts", func(t *testing.T) {
		hybridRanks(t, 4, []int{0, 0, 1, 1}, func(g comm.Comm, b *cudabackend.Backend, _ *barrier) error {
			sp := overlap.Spec{Kind: overlap.KindExpert, Name: "moe", Group: g, Backend: b, Rows: 16, K: 8, Outs: []int{8}, Experts: 8}
			_, not := strategies.Available(sp, nil)
			far := "group ranks 2, 3 are"
			if g.Rank() >= 2 {
				far = "group ranks 0, 1 are"
			}
			for _, name := range []string{"pipelined", "fused"} {
				if err := not[name]; err == nil || !strings.Contains(err.Error(), "spans hosts: "+far) {
					return fmt.Errorf("rank %d: %s across two hosts: %v, want a refusal naming %s", g.Rank(), name, err, far)
				}
			}
			return nil
		})
	})
}
