package overlap

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// The argument checks every strategy shares, so they refuse the same calls
// with the same words. Each returns this rank's rows n (and N = P·n).

func is2D(t *tensor.Tensor) bool { return t != nil && len(t.Shape()) == 2 }

func shapeErr(what, name string, t *tensor.Tensor, want string) error {
	return fmt.Errorf("%s: %s is %v, expected %s", what, name, t, want)
}

// CheckAllGatherMatmul checks x (n, K), xFull (N, K), ws[i] (M_i, K), outs[i] (N, M_i).
func CheckAllGatherMatmul(sp Spec, op string, outs []*tensor.Tensor, xFull, x *tensor.Tensor, ws []*tensor.Tensor) (n int, err error) {
	what := sp.what() + " " + op
	P := sp.Group.Size()
	if !is2D(x) {
		return 0, shapeErr(what, "x", x, "a 2-D (rows, K) tensor")
	}
	n, k := x.Dim(0), x.Dim(1)
	if len(ws) == 0 || len(ws) != len(outs) {
		return 0, fmt.Errorf("%s: %d weights and %d outputs: expected one output per weight, at least one", what, len(ws), len(outs))
	}
	if !is2D(xFull) || xFull.Dim(0) != P*n || xFull.Dim(1) != k || xFull.DType() != x.DType() {
		return 0, shapeErr(what, "xFull", xFull, fmt.Sprintf("%v(%d, %d) = (%d ranks × %d rows, K)", x.DType(), P*n, k, P, n))
	}
	for i, w := range ws {
		if !is2D(w) || w.Dim(1) != k {
			return 0, shapeErr(what, fmt.Sprintf("weight %d", i), w, fmt.Sprintf("(M, %d)", k))
		}
		if o := outs[i]; !is2D(o) || o.Dim(0) != P*n || o.Dim(1) != w.Dim(0) {
			return 0, shapeErr(what, fmt.Sprintf("output %d", i), o, fmt.Sprintf("(%d, %d)", P*n, w.Dim(0)))
		}
	}
	return n, nil
}

// CheckAllGatherMatmulBackward checks dx (n, K), douts[i] (N, M_i), dws[i] like ws[i].
func CheckAllGatherMatmulBackward(sp Spec, dx *tensor.Tensor, dws, douts []*tensor.Tensor, xFull *tensor.Tensor, ws []*tensor.Tensor) (n int, err error) {
	what := sp.what() + " backward"
	if !is2D(dx) {
		return 0, shapeErr(what, "dx", dx, "a 2-D (rows, K) tensor")
	}
	if n, err = CheckAllGatherMatmul(sp, "backward", douts, xFull, dx, ws); err != nil {
		return 0, err
	}
	if len(dws) != len(ws) {
		return 0, fmt.Errorf("%s: %d weight gradients for %d weights", what, len(dws), len(ws))
	}
	for i, dw := range dws {
		if dw == nil || !dw.Shape().Equal(ws[i].Shape()) {
			return 0, shapeErr(what, fmt.Sprintf("weight gradient %d", i), dw, fmt.Sprintf("the weight's shape %v", ws[i].Shape()))
		}
	}
	return n, nil
}

// CheckMatmulReduceScatter checks x (N, K), w (M, K), out (n, M) with N = P·n.
func CheckMatmulReduceScatter(sp Spec, op string, out, x, w *tensor.Tensor) (n int, err error) {
	what := sp.what() + " " + op
	P := sp.Group.Size()
	if !is2D(x) || x.Dim(0)%P != 0 {
		return 0, shapeErr(what, "x", x, fmt.Sprintf("a 2-D (N, K) tensor, N divisible by the %d ranks", P))
	}
	N, k := x.Dim(0), x.Dim(1)
	if !is2D(w) || w.Dim(1) != k {
		return 0, shapeErr(what, "w", w, fmt.Sprintf("(M, %d)", k))
	}
	if !is2D(out) || out.Dim(0) != N/P || out.Dim(1) != w.Dim(0) {
		return 0, shapeErr(what, "out (or dout)", out, fmt.Sprintf("(%d, %d) = (%d rows / %d ranks, M)", N/P, w.Dim(0), N, P))
	}
	return N / P, nil
}

// CheckMatmulReduceScatterBackward checks the arguments of
// MatmulReduceScatter.Backward.
func CheckMatmulReduceScatterBackward(sp Spec, dx, dw, dout, x, w *tensor.Tensor) (n int, err error) {
	if n, err = CheckMatmulReduceScatter(sp, "backward", dout, x, w); err != nil {
		return 0, err
	}
	what := sp.what() + " backward"
	if dx == nil || !dx.Shape().Equal(x.Shape()) {
		return 0, shapeErr(what, "dx", dx, fmt.Sprintf("x's shape %v", x.Shape()))
	}
	if dw == nil || !dw.Shape().Equal(w.Shape()) {
		return 0, shapeErr(what, "dw", dw, fmt.Sprintf("w's shape %v", w.Shape()))
	}
	return n, nil
}

// CheckMatmulAllReduce checks out (R, C), as[i] (R, K_i), ws[i] (C, K_i) or (K_i, C).
func CheckMatmulAllReduce(sp Spec, out *tensor.Tensor, as, ws []*tensor.Tensor, transW bool) (rows int, err error) {
	what := sp.what()
	if !is2D(out) {
		return 0, shapeErr(what, "out", out, "a 2-D (rows, C) tensor")
	}
	if len(as) == 0 || len(as) != len(ws) {
		return 0, fmt.Errorf("%s: %d inputs and %d weights: expected one weight per input, at least one", what, len(as), len(ws))
	}
	R, C := out.Dim(0), out.Dim(1)
	for i, a := range as {
		if !is2D(a) || a.Dim(0) != R {
			return 0, shapeErr(what, fmt.Sprintf("input %d", i), a, fmt.Sprintf("(%d, K)", R))
		}
		want := tensor.Shape{a.Dim(1), C}
		if transW {
			want = tensor.Shape{C, a.Dim(1)}
		}
		if ws[i] == nil || !ws[i].Shape().Equal(want) {
			return 0, shapeErr(what, fmt.Sprintf("weight %d", i), ws[i], want.String())
		}
	}
	return R, nil
}

// rows is the row view [lo, hi) of a 2-D tensor checked by the caller.
func rows(t *tensor.Tensor, lo, hi int) *tensor.Tensor {
	v, err := t.Rows(lo, hi)
	if err != nil { // cannot happen: the checks bound lo and hi
		panic(fmt.Sprintf("overlap: rows [%d, %d) of %v: %v", lo, hi, t, err))
	}
	return v
}

// buffer is a persistent scratch tensor of a site that grows to the
// largest request; get returns its first r rows.
type buffer struct{ t *tensor.Tensor }

func (p *buffer) get(b tensor.Backend, dt tensor.DType, r, c int) *tensor.Tensor {
	if p.t == nil || p.t.DType() != dt || p.t.Dim(1) != c || p.t.Dim(0) < r {
		p.free(b)
		p.t = b.Zeros(dt, max(r, 1), c)
	}
	return rows(p.t, 0, r)
}

func (p *buffer) free(b tensor.Backend) {
	if p.t != nil {
		b.Free(p.t)
		p.t = nil
	}
}

// Accumulator adds the partial results of a reduce-scatter into its
// output. A bf16 output is summed in fp32 and rounded once at the end, as
// a collective reduce-scatter rounds; float32 and float64 outputs are
// summed in place. Its scratch persists between calls (a site keeps one).
type Accumulator struct {
	acc, tmp buffer
	b        tensor.Backend
	out      *tensor.Tensor
	wide     bool
}

// Begin starts a sum into out, which holds the first term.
func (a *Accumulator) Begin(b tensor.Backend, out *tensor.Tensor) {
	a.b, a.out, a.wide = b, out, out.DType() == tensor.BFloat16
	if a.wide {
		acc := a.acc.get(b, tensor.Float32, out.Dim(0), out.Dim(1))
		b.Copy(acc, out)
	}
}

// Add adds part (shaped like out) to the sum.
func (a *Accumulator) Add(part *tensor.Tensor) {
	if !a.wide {
		a.b.Axpy(a.out, 1, part)
		return
	}
	tmp := a.tmp.get(a.b, tensor.Float32, part.Dim(0), part.Dim(1))
	a.b.Copy(tmp, part)
	a.b.Axpy(rows(a.acc.t, 0, a.out.Dim(0)), 1, tmp)
}

// End writes the sum to out.
func (a *Accumulator) End() {
	if a.wide {
		a.b.Copy(a.out, rows(a.acc.t, 0, a.out.Dim(0)))
	}
}

// Free gives the scratch back.
func (a *Accumulator) Free(b tensor.Backend) {
	a.acc.free(b)
	a.tmp.free(b)
}
