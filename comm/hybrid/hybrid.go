package hybrid

import (
	"errors"
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// Comm is one rank's handle on a hybrid group: the collectives of Coll and
// the symmetric memory of Sym, two groups of the same ranks in the same
// order.
type Comm struct {
	coll comm.Comm
	sym  comm.Comm
	mem  comm.SymmetricMemory
	opts []Option
	// hosts is the host of each world rank (WithHosts), members the world
	// rank of each group rank; nil: no placement.
	hosts, members []int
}

// Option configures New.
type Option func(*Comm)

// WithHosts places the world's ranks on hosts: hosts[r] is world rank r's
// host (equal values for the ranks of one host). Ranks of two hosts do not
// reach each other by loads and stores, whatever the symmetric side says
// (Reaches): a group that spans hosts keeps its symmetric memory, but the
// strategies built on peer pointers refuse it, naming the ranks of the
// other hosts, and a default keeps its sites on the collectives. New then
// needs the world rank of each rank of the collectives' group
// (comm.MembersOf).
func WithHosts(hosts []int) Option {
	h := append([]int(nil), hosts...)
	return func(c *Comm) { c.hosts = h }
}

var (
	_ comm.Comm            = (*Comm)(nil)
	_ comm.SymmetricMemory = (*Comm)(nil)
	_ comm.LoadStore       = (*Comm)(nil)
	_ comm.Aborter         = (*Comm)(nil)
	_ comm.NamedSplitter   = (*Comm)(nil)
	_ comm.Wrapper         = (*Comm)(nil)
)

// New composes coll (the collectives) and sym (symmetric memory: it must
// have comm.SymmetricMemory) into one group; they must hold this rank at
// the same rank of the same size.
func New(coll, sym comm.Comm, opts ...Option) (*Comm, error) {
	if coll == nil || sym == nil {
		return nil, errors.New("hybrid: expected a group for the collectives and one for symmetric memory, got nil")
	}
	mem, ok := comm.SymmetricOf(sym)
	if !ok {
		return nil, fmt.Errorf("hybrid: %s (%T) has no symmetric memory: expected a transport with comm.SymmetricMemory (NVSHMEM)", sym.Name(), sym)
	}
	if coll.Rank() != sym.Rank() || coll.Size() != sym.Size() {
		return nil, fmt.Errorf("hybrid: the collectives' group %s has this rank at %d of %d, the symmetric memory's %s at %d of %d: expected the same ranks in the same order (%w)",
			coll.Name(), coll.Rank(), coll.Size(), sym.Name(), sym.Rank(), sym.Size(), comm.ErrMismatch)
	}
	c := &Comm{coll: coll, sym: sym, mem: mem, opts: opts}
	for _, o := range opts {
		o(c)
	}
	if c.hosts != nil {
		m, ok := comm.MembersOf(coll)
		if !ok {
			return nil, fmt.Errorf("hybrid: a placement on hosts for %s (%T), which does not say the world rank of its ranks: expected a transport with comm.Membered", coll.Name(), coll)
		}
		for _, r := range m {
			if r < 0 || r >= len(c.hosts) {
				return nil, fmt.Errorf("hybrid: group %s has world rank %d, the placement on hosts %d ranks", coll.Name(), r, len(c.hosts))
			}
		}
		c.members = m
	}
	return c, nil
}

// Collectives and Symmetric are the two sides.
func (c *Comm) Collectives() comm.Comm { return c.coll }
func (c *Comm) Symmetric() comm.Comm   { return c.sym }

func (c *Comm) Rank() int    { return c.coll.Rank() }
func (c *Comm) Size() int    { return c.coll.Size() }
func (c *Comm) Name() string { return c.coll.Name() }

func (c *Comm) AllGather(dst, src *tensor.Tensor, s comm.Stream) (comm.Work, error) {
	return c.coll.AllGather(dst, src, s)
}

func (c *Comm) ReduceScatter(dst, src *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	return c.coll.ReduceScatter(dst, src, op, s)
}

func (c *Comm) AllReduce(buf *tensor.Tensor, op comm.ReduceOp, s comm.Stream) (comm.Work, error) {
	return c.coll.AllReduce(buf, op, s)
}

func (c *Comm) AllToAllV(dst, src *tensor.Tensor, sendCounts, recvCounts []int, s comm.Stream) (comm.Work, error) {
	return c.coll.AllToAllV(dst, src, sendCounts, recvCounts, s)
}

func (c *Comm) Broadcast(buf *tensor.Tensor, root int, s comm.Stream) (comm.Work, error) {
	return c.coll.Broadcast(buf, root, s)
}

func (c *Comm) Barrier() error { return c.coll.Barrier() }

// Split splits both sides with the same color and key.
func (c *Comm) Split(color, key int) (comm.Comm, error) { return c.SplitNamed(color, key, "") }

// SplitNamed splits both sides with the same color, key and label.
func (c *Comm) SplitNamed(color, key int, label string) (comm.Comm, error) {
	split := func(x comm.Comm) (comm.Comm, error) {
		if label == "" {
			return x.Split(color, key)
		}
		return comm.SplitNamed(x, color, key, label)
	}
	cc, err := split(c.coll)
	if err != nil {
		return nil, err
	}
	sc, err := split(c.sym)
	if err != nil {
		if cc != nil {
			cc.Close()
		}
		return nil, fmt.Errorf("hybrid: the symmetric memory's split of %s: %w", c.sym.Name(), err)
	}
	if cc == nil || sc == nil {
		if cc != nil || sc != nil {
			return nil, fmt.Errorf("hybrid: split of %s with color %d: one side made a group and the other none (%w)", c.Name(), color, comm.ErrMismatch)
		}
		return nil, nil
	}
	h, err := New(cc, sc, c.opts...)
	if err != nil {
		cc.Close()
		sc.Close()
		return nil, err
	}
	return h, nil
}

// Close closes both sides (the symmetric side last: its world may finalise).
func (c *Comm) Close() error { return errors.Join(c.coll.Close(), c.sym.Close()) }

// Abort aborts both sides where they can.
func (c *Comm) Abort(err error) {
	for _, x := range []comm.Comm{c.coll, c.sym} {
		if a, ok := x.(comm.Aborter); ok {
			a.Abort(err)
		}
	}
}

// Unwrap is the collective side, for the capabilities looked up through
// decorators.
func (c *Comm) Unwrap() comm.Comm { return c.coll }

// AllocSymmetric, FreeSymmetric and PeerPtr are the symmetric side's.
func (c *Comm) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	return c.mem.AllocSymmetric(shape, dt)
}

func (c *Comm) FreeSymmetric(t *tensor.Tensor) error { return c.mem.FreeSymmetric(t) }

func (c *Comm) PeerPtr(t *tensor.Tensor, r int) (uint64, error) { return c.mem.PeerPtr(t, r) }

// Reaches is the symmetric side's (comm.Reaches: its LoadStore, through
// decorators; true for every pair where it says nothing), and false for
// ranks on two hosts (WithHosts).
func (c *Comm) Reaches(a, b int) bool {
	if c.hosts != nil {
		if a < 0 || b < 0 || a >= len(c.members) || b >= len(c.members) || c.hosts[c.members[a]] != c.hosts[c.members[b]] {
			return false
		}
	}
	return comm.Reaches(c.sym, a, b)
}
