package comm_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/tensor"
)

// strategies are the Strategy implementations under test; each must match
// the unsharded reference.
var strategies = []comm.Strategy{comm.Collective{}}

// TestAllGatherMatmul: a sequence-parallel column-parallel linear. The
// unsharded layer is Y = X·Wᵀ with X (N, K), W (P·M, K); rank r holds rows
// part r of X and rows part r of W, and computes columns part r of Y.
func TestAllGatherMatmul(t *testing.T) {
	for _, s := range strategies {
		for _, p := range worlds {
			for _, keep := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/P=%d/keep=%v", s.Name(), p, keep), func(t *testing.T) {
					testAllGatherMatmul(t, s, p, keep)
				})
			}
		}
	}
}

func testAllGatherMatmul(t *testing.T, s comm.Strategy, p int, keep bool) {
	const n, k, m = 8, 5, 3 // N tokens, K features in, M features out per rank
	X, W, dY := seeded("X", n, k), seeded("W", p*m, k), seeded("dY", n, p*m)
	Y := matmul(X, W, true)
	dX := matmul(dY, W, false)
	dW := matmul(dY.T(), X, false)
	onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
		r := c.Rank()
		x, w := X.rows(r, p).t64(), W.rows(r, p).t64()
		out := tensor.MustHost(tensor.Float64, n, m)
		var xFull *tensor.Tensor
		if keep {
			xFull = tensor.MustHost(tensor.Float64, n, k)
		}
		if err := s.AllGatherMatmul(b, c, x, w, out, xFull); err != nil {
			return err
		}
		if err := near("out", out, Y.cols(r, p)); err != nil {
			return err
		}
		if keep {
			if err := near("xFull", xFull, X); err != nil {
				return err
			}
		}
		dx := tensor.MustHost(tensor.Float64, n/p, k)
		dw0 := seeded(fmt.Sprint("dw0/", r), m, k) // gradients accumulate
		dw := dw0.t64()
		if err := s.AllGatherMatmulBackward(b, c, dY.cols(r, p).t64(), x, xFull, w, dx, dw); err != nil {
			return err
		}
		if err := near("dx", dx, dX.rows(r, p)); err != nil {
			return err
		}
		return near("dw", dw, add(dw0, dW.rows(r, p)))
	})
}

// TestMatmulReduceScatter: a row-parallel linear followed by the
// sequence-parallel reduce-scatter. The unsharded layer is Y = X·Wᵀ with
// X (N, P·K), W (M, P·K); rank r holds columns part r of X and W, and gets
// rows part r of Y.
func TestMatmulReduceScatter(t *testing.T) {
	for _, s := range strategies {
		for _, p := range worlds {
			t.Run(fmt.Sprintf("%s/P=%d", s.Name(), p), func(t *testing.T) {
				testMatmulReduceScatter(t, s, p)
			})
		}
	}
}

func testMatmulReduceScatter(t *testing.T, s comm.Strategy, p int) {
	const n, k, m = 8, 3, 5 // N tokens, K features in per rank, M features out
	X, W, dY := seeded("X", n, p*k), seeded("W", m, p*k), seeded("dY", n, m)
	Y := matmul(X, W, true)
	dX := matmul(dY, W, false)
	dW := matmul(dY.T(), X, false)
	onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
		r := c.Rank()
		x, w := X.cols(r, p).t64(), W.cols(r, p).t64()
		out := tensor.MustHost(tensor.Float64, n/p, m)
		if err := s.MatmulReduceScatter(b, c, x, w, out); err != nil {
			return err
		}
		if err := near("out", out, Y.rows(r, p)); err != nil {
			return err
		}
		dx := tensor.MustHost(tensor.Float64, n, k)
		dw0 := seeded(fmt.Sprint("dw0/", r), m, k)
		dw := dw0.t64()
		if err := s.MatmulReduceScatterBackward(b, c, dY.rows(r, p).t64(), x, w, dx, dw); err != nil {
			return err
		}
		if err := near("dx", dx, dX.cols(r, p)); err != nil {
			return err
		}
		return near("dw", dw, add(dw0, dW.cols(r, p)))
	})
}

// TestFusedFloat32: the same ops in float32 stay within the fp32 tolerance.
func TestFusedFloat32(t *testing.T) {
	const p, n, k, m = 2, 4, 3, 2
	X, W := seeded("X", n, k), seeded("W", p*m, k)
	Y := matmul(X, W, true)
	onRanks(t, p, func(c comm.Comm, b tensor.Backend) error {
		r := c.Rank()
		x, w := tensor.MustHost(tensor.Float32, n/p, k), tensor.MustHost(tensor.Float32, m, k)
		x.SetFloat64s(X.rows(r, p).v)
		w.SetFloat64s(W.rows(r, p).v)
		out := tensor.MustHost(tensor.Float32, n, m)
		if err := (comm.Collective{}).AllGatherMatmul(b, c, x, w, out, nil); err != nil {
			return err
		}
		got, _ := out.Float64s()
		want := Y.cols(r, p).v
		for i := range got {
			if d := got[i] - want[i]; d > 1e-5 || d < -1e-5 {
				return fmt.Errorf("out[%d] = %v, want %v", i, got[i], want[i])
			}
		}
		return nil
	})
}

func TestStrategyErrors(t *testing.T) {
	onRanks(t, 2, func(c comm.Comm, b tensor.Backend) error {
		x, w := tensor.MustHost(tensor.Float32, 2, 3), tensor.MustHost(tensor.Float32, 4, 3)
		err := comm.Collective{}.AllGatherMatmul(b, c, x, w, tensor.MustHost(tensor.Float32, 2, 4), nil)
		var e *comm.Error
		if !errors.As(err, &e) || e.Op != "all-gather-matmul" {
			return fmt.Errorf("all-gather-matmul with a bad out: %v", err)
		}
		err = comm.Collective{}.MatmulReduceScatter(b, c, tensor.MustHost(tensor.Float32, 3, 3), w, tensor.MustHost(tensor.Float32, 1, 4))
		if !errors.As(err, &e) || e.Op != "matmul-reduce-scatter" {
			return fmt.Errorf("matmul-reduce-scatter with odd rows: %v", err)
		}
		return nil
	})
}
