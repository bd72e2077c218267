package overlap_test

import (
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// worlds are the sizes every sharded op is tested on.
var worlds = []int{1, 2, 4}

// onRanks runs fn on every rank of a local world of n, each with its own
// CPU backend, and fails the test with the ranks' errors.
func onRanks(t *testing.T, n int, fn func(c comm.Comm, b tensor.Backend) error) {
	t.Helper()
	err := local.Run(n, func(c comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		if err := fn(c, b); err != nil {
			return err
		}
		return b.Err()
	}, local.WithTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
}

// mat is a row-major float64 matrix: the reference side of the tests.
type mat struct {
	r, c int
	v    []float64
}

// seeded returns the matrix named name (every rank builds the same one).
func seeded(name string, r, c int) mat {
	h := fnv.New64a()
	fmt.Fprint(h, name)
	return mat{r, c, testutil.RandFloats(testutil.Rng(h.Sum64()), r*c, 0.1, 1)}
}

func (m mat) at(i, j int) float64 { return m.v[i*m.c+j] }

// matmul returns a·bᵀ when bT, else a·b.
func matmul(a, b mat, bT bool) mat {
	n, k, m := a.r, a.c, b.c
	if bT {
		m = b.r
	}
	out := mat{n, m, make([]float64, n*m)}
	for i := range n {
		for j := range m {
			var s float64
			for l := range k {
				if bT {
					s += a.at(i, l) * b.at(j, l)
				} else {
					s += a.at(i, l) * b.at(l, j)
				}
			}
			out.v[i*m+j] = s
		}
	}
	return out
}

func (m mat) T() mat {
	out := mat{m.c, m.r, make([]float64, len(m.v))}
	for i := range m.r {
		for j := range m.c {
			out.v[j*m.r+i] = m.at(i, j)
		}
	}
	return out
}

func add(a, b mat) mat {
	out := mat{a.r, a.c, make([]float64, len(a.v))}
	for i := range a.v {
		out.v[i] = a.v[i] + b.v[i]
	}
	return out
}

// rows returns rows part p of parts.
func (m mat) rows(p, parts int) mat {
	n := m.r / parts
	return mat{n, m.c, m.v[p*n*m.c : (p+1)*n*m.c]}
}

// cols returns columns part p of parts.
func (m mat) cols(p, parts int) mat {
	w := m.c / parts
	out := mat{m.r, w, make([]float64, 0, m.r*w)}
	for i := range m.r {
		out.v = append(out.v, m.v[i*m.c+p*w:i*m.c+(p+1)*w]...)
	}
	return out
}

// catRows stacks ms along dim 0; catCols along the last dim.
func catRows(ms ...mat) mat {
	out := mat{0, ms[0].c, nil}
	for _, m := range ms {
		out.r += m.r
		out.v = append(out.v, m.v...)
	}
	return out
}

func catCols(ms ...mat) mat {
	var parts []mat
	for _, m := range ms {
		parts = append(parts, m.T())
	}
	return catRows(parts...).T()
}

// t64 is m as a host float64 tensor.
func (m mat) t64() *tensor.Tensor {
	t, err := tensor.FromFloat64(append([]float64(nil), m.v...), m.r, m.c)
	if err != nil {
		panic(err)
	}
	return t
}

// near checks a tensor against the reference, by relative norm.
func near(name string, got *tensor.Tensor, want mat) error {
	if !got.Shape().Equal(tensor.Shape{want.r, want.c}) {
		return fmt.Errorf("%s: shape %v, want (%d, %d)", name, got.Shape(), want.r, want.c)
	}
	v, err := got.Float64s()
	if err != nil {
		return err
	}
	if e := testutil.RelErr(v, want.v); !(e <= 1e-12) {
		return fmt.Errorf("%s: relative error %.3g", name, e)
	}
	return nil
}

// wait runs an op and waits on its work.
func wait(w comm.Work, err error) error {
	if err != nil {
		return err
	}
	return w.Wait(nil)
}
