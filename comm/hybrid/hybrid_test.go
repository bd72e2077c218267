package hybrid_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
)

// symSide is a symmetric side for the test: host tensors, and peers
// reached only on the same host (host[group rank]).
type symSide struct {
	comm.Comm
	host   []int
	allocs *int
}

func (s *symSide) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	*s.allocs++
	return tensor.MustHost(dt, shape...), nil
}
func (s *symSide) FreeSymmetric(*tensor.Tensor) error { return nil }
func (s *symSide) PeerPtr(_ *tensor.Tensor, r int) (uint64, error) {
	return uint64(1000 + r), nil
}
func (s *symSide) Reaches(a, b int) bool { return s.host[a] == s.host[b] }
func (s *symSide) Split(color, key int) (comm.Comm, error) {
	c, err := s.Comm.Split(color, key)
	if err != nil || c == nil {
		return nil, err
	}
	return &symSide{Comm: c, host: s.host, allocs: s.allocs}, nil
}

// The collectives are the collective side's (checked against the
// reference sum); symmetric memory and reach are the other side's; a
// group of two sides that disagree on the ranks, or a side without
// symmetric memory, is refused.
func TestHybrid(t *testing.T) {
	coll := local.NewWorld(2, local.WithTimeout(5*time.Second))
	sym := local.NewWorld(2, local.WithTimeout(5*time.Second))
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			allocs := 0
			h, err := hybrid.New(coll[r], &symSide{Comm: sym[r], host: []int{0, 1}, allocs: &allocs})
			if err != nil {
				errs <- err
				return
			}
			x, _ := tensor.FromFloat32([]float32{float32(r + 1)}, 1)
			w, err := h.AllReduce(x, comm.Sum, nil)
			if err == nil {
				err = w.Wait(nil)
			}
			if err == nil && x.F32()[0] != 3 {
				err = errors.New("all-reduce: want 3")
			}
			if _, e := h.AllocSymmetric([]int{4}, tensor.Float32); e != nil || allocs != 1 {
				err = errors.Join(err, e, errors.New("AllocSymmetric did not reach the symmetric side"))
			}
			if sm, ok := comm.SymmetricOf(h); !ok || sm != comm.SymmetricMemory(h) {
				err = errors.Join(err, errors.New("SymmetricOf(hybrid) is not the hybrid"))
			}
			if far, all := comm.Unreachable(h); all || len(far) != 1 || far[0] != 1-r {
				err = errors.Join(err, errors.New("the two hosts' ranks should not reach each other"))
			}
			g, e := h.Split(0, r)
			if e == nil {
				if _, ok := g.(*hybrid.Comm); !ok || g.Size() != 2 || g.Rank() != r {
					e = errors.New("Split: want a hybrid group of both ranks")
				}
			}
			errs <- errors.Join(err, e)
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if _, err := hybrid.New(coll[0], sym[1]); err == nil || !strings.Contains(err.Error(), "has no symmetric memory") {
		t.Errorf("a side without symmetric memory: %v", err)
	}
	allocs := 0
	if _, err := hybrid.New(coll[0], &symSide{Comm: sym[1], allocs: &allocs}); err == nil || !errors.Is(err, comm.ErrMismatch) {
		t.Errorf("sides with this rank at different ranks: %v, want ErrMismatch", err)
	}
}

// allReach is a symmetric side whose every rank reaches every other (one
// address space, as the kernel emulator's).
type allReach struct{ comm.Comm }

func (s allReach) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	return tensor.MustHost(dt, shape...), nil
}
func (allReach) FreeSymmetric(*tensor.Tensor) error              { return nil }
func (allReach) PeerPtr(_ *tensor.Tensor, r int) (uint64, error) { return uint64(1000 + r), nil }
func (allReach) Reaches(a, b int) bool                           { return true }
func (s allReach) Split(color, key int) (comm.Comm, error)       { return s.SplitNamed(color, key, "") }
func (s allReach) SplitNamed(color, key int, l string) (comm.Comm, error) {
	c, err := comm.SplitNamed(s.Comm, color, key, l)
	if err != nil || c == nil {
		return nil, err
	}
	return allReach{c}, nil
}

// WithHosts: ranks of two hosts do not reach each other, whatever the
// symmetric side says, in the world and in every group split from it; the
// groups inside a host reach all their ranks; a collective side that does
// not say its members is refused.
func TestHybridHosts(t *testing.T) {
	coll := local.NewWorld(4, local.WithTimeout(5*time.Second))
	sym := local.NewWorld(4, local.WithTimeout(5*time.Second))
	hosts := []int{7, 7, 9, 9}
	errs := make(chan error, 4)
	for r := range 4 {
		go func() {
			h, err := hybrid.New(coll[r], allReach{sym[r]}, hybrid.WithHosts(hosts))
			if err != nil {
				errs <- err
				return
			}
			g, err := comm.NewGrid(h, 2, 2, 4)
			if err != nil {
				errs <- err
				return
			}
			defer g.Close()
			other := []int{2, 3}
			if r >= 2 {
				other = []int{0, 1}
			}
			for _, c := range []struct {
				g    comm.Comm
				far  []int
				name string
			}{{h, other, "world"}, {g.TPGroup, nil, "tp"}, {g.DPGroup, []int{1 - g.DPGroup.Rank()}, "dp"}, {g.EPGroup, other, "ep"}} {
				far, all := comm.Unreachable(c.g)
				if all != (c.far == nil) || !slices.Equal(far, c.far) {
					errs <- fmt.Errorf("rank %d: %s group %s: unreachable %v (all %v), want %v", r, c.name, c.g.Name(), far, all, c.far)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if _, err := hybrid.New(noMembers{coll[0]}, allReach{sym[0]}, hybrid.WithHosts(hosts)); err == nil || !strings.Contains(err.Error(), "comm.Membered") {
		t.Errorf("hosts without members: %v, want a refusal naming comm.Membered", err)
	}
}

// noMembers hides the group's members.
type noMembers struct{ comm.Comm }

// decorated hides its symmetric side behind a decorator (comm.Wrapper),
// as a transport's instrumentation would.
type decorated struct{ comm.Comm }

func (d decorated) Unwrap() comm.Comm { return d.Comm }

// A symmetric side behind a decorator answers for each pair itself: of
// three ranks, 0 and 1 on one host and 2 on another, 0 and 1 reach each
// other although not every pair of the group does, and neither reaches 2.
func TestReachesThroughDecorator(t *testing.T) {
	coll := local.NewWorld(3, local.WithTimeout(5*time.Second))
	sym := local.NewWorld(3, local.WithTimeout(5*time.Second))
	host := []int{0, 0, 1}
	errs := make(chan error, 3)
	for r := range 3 {
		go func() {
			allocs := 0
			h, err := hybrid.New(coll[r], decorated{&symSide{Comm: sym[r], host: host, allocs: &allocs}})
			if err != nil {
				errs <- err
				return
			}
			for a := range 3 {
				for b := range 3 {
					if got, want := h.Reaches(a, b), host[a] == host[b]; got != want {
						err = errors.Join(err, fmt.Errorf("rank %d: Reaches(%d, %d) = %v, want %v", r, a, b, got, want))
					}
				}
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
