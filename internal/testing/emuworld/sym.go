//go:build asynctp_emu

package emuworld

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Registry is an emulated world's shared state: the table of a group's
// symmetric allocations (and, by name, of the groups split from it: the
// same object for every rank of one), and the ranks' backends, kept open
// until every rank has returned (Keep, CloseAll).
type Registry struct {
	mu       sync.Mutex
	addrs    map[int][]uint64 // allocation number → each rank's address
	frees    map[int][]int    // allocation number → each rank's frees of it
	children map[string]*Registry
	open     []*cudabackend.Backend
}

// NewRegistry is the registry of a new world.
func NewRegistry() *Registry {
	return &Registry{addrs: map[int][]uint64{}, frees: map[int][]int{}, children: map[string]*Registry{}}
}

// child is the registry of the group called name split from r's.
func (r *Registry) child(name string) *Registry {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.children[name] == nil {
		r.children[name] = NewRegistry()
	}
	return r.children[name]
}

// SymmetricCounts returns the symmetric allocations made so far in r's
// group and the groups split from it (one per allocation, all ranks
// together), and an error naming each (group, allocation, rank) whose
// copy was not freed exactly once (FreeSymmetric). Call it after the
// ranks have returned.
func (r *Registry) SymmetricCounts() (allocs int, err error) {
	var bad []string
	r.count("world", &allocs, &bad)
	if len(bad) > 0 {
		return allocs, fmt.Errorf("%d rank copies of the %d symmetric allocations not freed exactly once: %s", len(bad), allocs, strings.Join(bad, "; "))
	}
	return allocs, nil
}

func (r *Registry) count(name string, allocs *int, bad *[]string) {
	r.mu.Lock()
	ns := make([]int, 0, len(r.addrs))
	for n := range r.addrs {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	for _, n := range ns {
		*allocs++
		for rank, k := range r.frees[n] {
			if k != 1 {
				*bad = append(*bad, fmt.Sprintf("group %s allocation %d on rank %d freed %d times", name, n, rank, k))
			}
		}
	}
	kids := make([]string, 0, len(r.children))
	for k := range r.children {
		kids = append(kids, k)
	}
	sort.Strings(kids)
	children := r.children
	r.mu.Unlock()
	for _, k := range kids {
		children[k].count(k, allocs, bad)
	}
}

// Keep holds a rank's backend open until CloseAll. A rank's emulated
// device memory is host memory that its peers' kernels store into up to
// their last launch (the acks of the last step, the signals of a failed
// one): a rank that closed its backend when its own work ended would free
// memory that a slower peer's kernel then writes, corrupting the C heap.
// On GPUs the symmetric heap outlives the world's kernels the same way
// (FreeSymmetric is collective).
func (r *Registry) Keep(b *cudabackend.Backend) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.open = append(r.open, b)
}

// CloseAll closes the backends of Keep; call it after local.Run, which
// returns once every rank has.
func (r *Registry) CloseAll(t testing.TB) {
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

// Sym is a rank's group with symmetric memory over a registry, on B; its
// collectives are those of the group it wraps (a Staged one for
// collectives of device tensors). With hosts (the host of each world
// rank) a rank has no peer pointer to the ranks of another host. The
// groups split from it are Syms too, over registries of their own.
type Sym struct {
	comm.Comm
	B     *cudabackend.Backend
	Reg   *Registry
	hosts []int
	seq   int
	mine  map[uint64]symAlloc // own base address → allocation
}

// symAlloc is a rank's symmetric allocation: its number in the registry,
// and the tensor, held until FreeSymmetric so that its block is not
// recycled (the backend's cleanup of unreachable buffers) while peers
// still hold its address.
type symAlloc struct {
	n int
	t *tensor.Tensor
}

// NewSym is a rank's group c with symmetric memory on b over reg; hosts
// may be nil (one host).
func NewSym(c comm.Comm, b *cudabackend.Backend, reg *Registry, hosts []int) *Sym {
	return &Sym{Comm: c, B: b, Reg: reg, hosts: hosts, mine: map[uint64]symAlloc{}}
}

// Unwrap is the group underneath.
func (c *Sym) Unwrap() comm.Comm { return c.Comm }

func (c *Sym) Split(color, key int) (comm.Comm, error) { return c.SplitNamed(color, key, "") }

func (c *Sym) SplitNamed(color, key int, label string) (comm.Comm, error) {
	g, err := comm.SplitNamed(c.Comm, color, key, label)
	if err != nil || g == nil {
		return nil, err
	}
	return NewSym(g, c.B, c.Reg.child(g.Name()), c.hosts), nil
}

// AllocSymmetric allocates on every rank and registers the addresses
// (collective).
func (c *Sym) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	t := c.B.Zeros(dt, shape...)
	if err := c.B.Sync(); err != nil {
		return nil, err
	}
	n, a := c.seq, cudabackend.DevicePtr(t)
	c.seq++
	c.Reg.mu.Lock()
	if c.Reg.addrs[n] == nil {
		c.Reg.addrs[n] = make([]uint64, c.Size())
	}
	c.Reg.addrs[n][c.Rank()] = a
	if c.Reg.frees[n] == nil {
		c.Reg.frees[n] = make([]int, c.Size())
	}
	c.Reg.mu.Unlock()
	c.mine[a] = symAlloc{n, t}
	return t, c.Barrier() // every rank has registered it
}

// FreeSymmetric is collective, as on GPUs: a rank gives its copy back
// only once every rank has reached the call, when no peer's kernel (each
// runs to completion in the emulator) is left to store into it.
func (c *Sym) FreeSymmetric(t *tensor.Tensor) error {
	a := cudabackend.DevicePtr(t)
	if _, ok := c.mine[a]; !ok {
		return fmt.Errorf("free of %v: not a symmetric allocation of this rank", t)
	}
	if err := c.Barrier(); err != nil {
		return err
	}
	s := c.mine[a]
	delete(c.mine, a)
	c.Reg.mu.Lock()
	c.Reg.frees[s.n][c.Rank()]++
	c.Reg.mu.Unlock()
	c.B.Free(t)
	return c.B.Err()
}

// PeerPtr is rank r's address of the symmetric allocation t.
func (c *Sym) PeerPtr(t *tensor.Tensor, r int) (uint64, error) {
	s, ok := c.mine[cudabackend.DevicePtr(t)]
	if !ok {
		return 0, fmt.Errorf("not a symmetric allocation")
	}
	if c.hosts != nil {
		m, _ := comm.MembersOf(c.Comm)
		if c.hosts[m[r]] != c.hosts[m[c.Rank()]] {
			return 0, fmt.Errorf("group rank %d (world rank %d) is on another host: no peer pointer", r, m[r])
		}
	}
	c.Reg.mu.Lock()
	defer c.Reg.mu.Unlock()
	return c.Reg.addrs[s.n][r], nil
}
