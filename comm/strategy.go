package comm

import (
	"fmt"

	"github.com/asynctp/asynctp/tensor"
)

// Strategy runs the fused communication sites of sequence-parallel tensor
// parallelism: the all-gather with the matmul that consumes it, and the
// matmul with the reduce-scatter that follows it, each with its backward
// twin. Collective is the reference; the pipelined and fused (NVSHMEM)
// strategies must give the same numbers within bf16 tolerance.
//
// Shapes, with P = c.Size() and N the full sequence (tokens):
//
//	AllGatherMatmul      x (N/P, K), w (M, K)  → out (N, M)   = all-gather(x) @ wᵀ
//	MatmulReduceScatter  x (N, K), w (M, K)    → out (N/P, M) = reduce-scatter(x @ wᵀ)
//
// (a column-parallel linear, M = this rank's output features; a row-parallel
// linear, K = this rank's input features). Arguments are inputs first, then
// outputs. Every op's result is ordered on the strategy's stream; the ops
// return when the host is done queuing (on the CPU: when they are done).
// Backend errors are sticky in b, as always; the error returned is that of
// the checks and of the communication.
type Strategy interface {
	// Name says which strategy this is ("collective", "pipelined", "fused").
	Name() string

	// AllGatherMatmul: out (N, M) = all-gather(x (N/P, K)) @ wᵀ, w (M, K).
	// When xFull (N, K) is not nil it receives the gathered x, to be kept
	// for the backward.
	AllGatherMatmul(b tensor.Backend, c Comm, x, w, out, xFull *tensor.Tensor) error
	// AllGatherMatmulBackward: dx (N/P, K) = reduce-scatter(dout @ w),
	// dw (M, K) += doutᵀ @ all-gather(x), for dout (N, M). xFull is the
	// gathered x kept by the forward, or nil to gather x again.
	AllGatherMatmulBackward(b tensor.Backend, c Comm, dout, x, xFull, w, dx, dw *tensor.Tensor) error

	// MatmulReduceScatter: out (N/P, M) = reduce-scatter(x (N, K) @ wᵀ)
	// (sum over ranks), w (M, K).
	MatmulReduceScatter(b tensor.Backend, c Comm, x, w, out *tensor.Tensor) error
	// MatmulReduceScatterBackward: with doutFull (N, M) = all-gather(dout
	// (N/P, M)): dx (N, K) = doutFull @ w, dw (M, K) += doutFullᵀ @ x.
	MatmulReduceScatterBackward(b tensor.Backend, c Comm, dout, x, w, dx, dw *tensor.Tensor) error
}

// Collective is the reference Strategy: the collective, then the matmul (or
// the matmul, then the collective), with scratch from the backend. Stream is
// the backend's stream, on which the collectives are queued (nil on the
// CPU).
type Collective struct {
	Stream Stream
}

var _ Strategy = Collective{}

func (Collective) Name() string { return "collective" }

const (
	opAGMM  = "all-gather-matmul"
	opAGMMb = "all-gather-matmul backward"
	opMMRS  = "matmul-reduce-scatter"
	opMMRSb = "matmul-reduce-scatter backward"
)

// AllGatherMatmul gathers x into xFull (or a scratch), then out = xFull @ wᵀ.
func (k Collective) AllGatherMatmul(b tensor.Backend, c Comm, x, w, out, xFull *tensor.Tensor) error {
	n, kk, _, err := checkAGMM(c, opAGMM, x, w, out, xFull)
	if err != nil {
		return err
	}
	if c.Size() == 1 && xFull == nil {
		xFull = x // nothing to gather, nothing to keep
	}
	full, free := scratchIf(b, xFull, x.DType(), n, kk)
	defer free()
	if err := k.gather(b, c, opAGMM, full, x); err != nil {
		return err
	}
	b.MatMul(out, full, w, false, true, 1, 0)
	return nil
}

// AllGatherMatmulBackward: dw += doutᵀ @ xFull, then dx = reduce-scatter(dout @ w).
func (k Collective) AllGatherMatmulBackward(b tensor.Backend, c Comm, dout, x, xFull, w, dx, dw *tensor.Tensor) error {
	n, kk, _, err := checkAGMM(c, opAGMMb, x, w, dout, xFull)
	if err != nil {
		return err
	}
	if err := sameShape(c, opAGMMb, "dx", dx, x); err != nil {
		return err
	}
	if err := sameShape(c, opAGMMb, "dw", dw, w); err != nil {
		return err
	}
	full := xFull
	if full == nil && c.Size() == 1 {
		full = x
	}
	if full == nil {
		var free func()
		full, free = scratchIf(b, nil, x.DType(), n, kk)
		defer free()
		if err := k.gather(b, c, opAGMMb, full, x); err != nil {
			return err
		}
	}
	b.MatMul(dw, dout, full, true, false, 1, 1)
	if c.Size() == 1 {
		b.MatMul(dx, dout, w, false, false, 1, 0)
		return nil
	}
	dfull := b.Zeros(dx.DType(), n, kk) // (N, K), this rank's partial dx
	defer b.Free(dfull)
	b.MatMul(dfull, dout, w, false, false, 1, 0)
	return k.reduceScatter(c, opAGMMb, dx, dfull)
}

// MatmulReduceScatter: partial (N, M) = x @ wᵀ, then out = reduce-scatter(partial).
func (k Collective) MatmulReduceScatter(b tensor.Backend, c Comm, x, w, out *tensor.Tensor) error {
	n, m, err := checkMMRS(c, opMMRS, x, w, out)
	if err != nil {
		return err
	}
	if c.Size() == 1 {
		b.MatMul(out, x, w, false, true, 1, 0)
		return nil
	}
	partial := b.Zeros(out.DType(), n, m)
	defer b.Free(partial)
	b.MatMul(partial, x, w, false, true, 1, 0)
	return k.reduceScatter(c, opMMRS, out, partial)
}

// MatmulReduceScatterBackward: doutFull = all-gather(dout), then dx = doutFull @ w
// and dw += doutFullᵀ @ x.
func (k Collective) MatmulReduceScatterBackward(b tensor.Backend, c Comm, dout, x, w, dx, dw *tensor.Tensor) error {
	n, m, err := checkMMRS(c, opMMRSb, x, w, dout)
	if err != nil {
		return err
	}
	if err := sameShape(c, opMMRSb, "dx", dx, x); err != nil {
		return err
	}
	if err := sameShape(c, opMMRSb, "dw", dw, w); err != nil {
		return err
	}
	full := dout // (N, M)
	if c.Size() > 1 {
		var free func()
		full, free = scratchIf(b, nil, dout.DType(), n, m)
		defer free()
		if err := k.gather(b, c, opMMRSb, full, dout); err != nil {
			return err
		}
	}
	b.MatMul(dx, full, w, false, false, 1, 0)
	b.MatMul(dw, full, x, true, false, 1, 1)
	return nil
}

// gather all-gathers src into dst along dim 0 and orders the result on the
// stream (a copy on a group of one rank).
func (k Collective) gather(b tensor.Backend, c Comm, op string, dst, src *tensor.Tensor) error {
	if c.Size() == 1 {
		if !sameView(dst, src) {
			b.Copy(dst, src)
		}
		return nil
	}
	wk, err := c.AllGather(dst, src, k.Stream)
	if err == nil {
		err = wk.Wait(k.Stream)
	}
	if err != nil {
		return fmt.Errorf("comm: %s: %w", op, err)
	}
	return nil
}

func (k Collective) reduceScatter(c Comm, op string, dst, src *tensor.Tensor) error {
	wk, err := c.ReduceScatter(dst, src, Sum, k.Stream)
	if err == nil {
		err = wk.Wait(k.Stream)
	}
	if err != nil {
		return fmt.Errorf("comm: %s: %w", op, err)
	}
	return nil
}

// scratchIf returns t when it is not nil, else a fresh (rows, cols) tensor of
// b and the function that frees it.
func scratchIf(b tensor.Backend, t *tensor.Tensor, dt tensor.DType, rows, cols int) (*tensor.Tensor, func()) {
	if t != nil {
		return t, func() {}
	}
	s := b.Zeros(dt, rows, cols)
	return s, func() { b.Free(s) }
}

// checkAGMM checks x (N/P, K), w (M, K), out (N, M), xFull (N, K) or nil and
// returns N, K, M.
func checkAGMM(c Comm, op string, x, w, out, xFull *tensor.Tensor) (n, k, m int, err error) {
	if err := check2D(c, op, "x", x); err != nil {
		return 0, 0, 0, err
	}
	if err := check2D(c, op, "w", w); err != nil {
		return 0, 0, 0, err
	}
	n, k, m = x.Dim(0)*c.Size(), x.Dim(1), w.Dim(0)
	if w.Dim(1) != k {
		return 0, 0, 0, Errorf(c, op, "x %v, w %v: expected w (M, %d) to match x's last dim", x, w, k)
	}
	if out == nil || !out.Shape().Equal(tensor.Shape{n, m}) {
		return 0, 0, 0, Errorf(c, op, "out (or dout) %v: expected (%d, %d) = (%d ranks × %d rows, w's %d rows)", out, n, m, c.Size(), x.Dim(0), m)
	}
	if xFull != nil && (!xFull.Shape().Equal(tensor.Shape{n, k}) || xFull.DType() != x.DType()) {
		return 0, 0, 0, Errorf(c, op, "xFull %v: expected %v(%d, %d), the gathered x", xFull, x.DType(), n, k)
	}
	return n, k, m, nil
}

// checkMMRS checks x (N, K), w (M, K), out (N/P, M) and returns N, M.
func checkMMRS(c Comm, op string, x, w, out *tensor.Tensor) (n, m int, err error) {
	if err := check2D(c, op, "x", x); err != nil {
		return 0, 0, err
	}
	if err := check2D(c, op, "w", w); err != nil {
		return 0, 0, err
	}
	n, m = x.Dim(0), w.Dim(0)
	if w.Dim(1) != x.Dim(1) {
		return 0, 0, Errorf(c, op, "x %v, w %v: expected w (M, %d) to match x's last dim", x, w, x.Dim(1))
	}
	if n%c.Size() != 0 {
		return 0, 0, Errorf(c, op, "x %v: expected rows divisible by the %d ranks", x, c.Size())
	}
	if out == nil || !out.Shape().Equal(tensor.Shape{n / c.Size(), m}) {
		return 0, 0, Errorf(c, op, "out (or dout) %v: expected (%d, %d) = (%d rows / %d ranks, w's %d rows)", out, n/c.Size(), m, n, c.Size(), m)
	}
	return n, m, nil
}

func check2D(c Comm, op, name string, t *tensor.Tensor) error {
	if t == nil || len(t.Shape()) != 2 {
		return Errorf(c, op, "%s %v: expected a 2-D tensor", name, t)
	}
	return nil
}

func sameShape(c Comm, op, name string, got, like *tensor.Tensor) error {
	if got == nil || !got.Shape().Equal(like.Shape()) {
		return Errorf(c, op, "%s %v: expected shape %v", name, got, like.Shape())
	}
	return nil
}
