package hybrid_test

import (
	"errors"
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
