package tp_test

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/parallel/tp"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

const seed = 7

// tens makes a host tensor of dt holding vals.
func tens(dt tensor.DType, vals []float64, shape ...int) *tensor.Tensor {
	t := tensor.MustHost(dt, shape...)
	if err := t.SetFloat64s(vals); err != nil {
		panic(err)
	}
	return t
}

// rowLayer is a layer that maps rows: out from x, dx from dout.
type rowLayer interface {
	Forward(out, x *tensor.Tensor) error
	Backward(dx, dout *tensor.Tensor) error
}

// tpLayer is the TP version of a rowLayer.
type tpLayer interface {
	rowLayer
	Shards() []shard.Shard
}

// seqLayer is a TP layer that takes the batch and sequence sizes
// (tp.Attention, tp.Block).
type seqLayer interface {
	Forward(out, x *tensor.Tensor, batch, seq int) error
	Backward(dx, dout *tensor.Tensor) error
	Shards() []shard.Shard
}

// batched runs a seqLayer on rows of B sequences of T tokens.
type batched struct {
	seqLayer
	B, T int
}

func (l batched) Forward(out, x *tensor.Tensor) error { return l.seqLayer.Forward(out, x, l.B, l.T) }

// in3D runs a layer of (B, T, C) tensors (layers.Attention, layers.Block)
// on (B·T, C) rows.
type in3D struct {
	l    rowLayer
	B, T int
}

func (l in3D) view(t *tensor.Tensor) *tensor.Tensor { return layerkit.Reshape(t, l.B, l.T, t.Dim(1)) }

func (l in3D) Forward(out, x *tensor.Tensor) error { return l.l.Forward(l.view(out), l.view(x)) }

func (l in3D) Backward(dx, dout *tensor.Tensor) error { return l.l.Backward(l.view(dx), l.view(dout)) }

// reference is what a layer of package layers computes from random x
// (N, In) and output gradient dout (N, Out): its parameters after the
// backward, and x, y, dx and dout.
type reference struct {
	params         refParams
	x, y, dx, dout []float64
}

func runReference(t *testing.T, s setup, N, in, out int, newLayer func(b tensor.Backend, ps *layers.ParamSet) (rowLayer, error)) reference {
	t.Helper()
	b := cpu.New()
	ps := layers.NewParamSet(seed)
	l, err := newLayer(b, ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, s.dt); err != nil {
		t.Fatal(err)
	}
	x, dout := random(1, s.dt, N, in), random(2, s.dt, N, out)
	y, dx := b.Zeros(s.dt, N, out), b.Zeros(s.dt, N, in)
	if err := l.Forward(y, x); err != nil {
		t.Fatal(err)
	}
	if err := l.Backward(dx, dout); err != nil {
		t.Fatal(err)
	}
	return reference{params: refOf(b, ps), x: testutil.Download(b, x), y: testutil.Download(b, y),
		dx: testutil.Download(b, dx), dout: testutil.Download(b, dout)}
}

// newRef binds the name and configuration of a constructor of package
// layers.
func newRef[C any, L rowLayer](newLayer func(tensor.Backend, *layers.ParamSet, string, C) (L, error), name string, cfg C) func(tensor.Backend, *layers.ParamSet) (rowLayer, error) {
	return func(b tensor.Backend, ps *layers.ParamSet) (rowLayer, error) { return newLayer(b, ps, name, cfg) }
}

// newTP binds the name and configuration of a constructor of package tp.
func newTP[C, L any](newLayer func(tensor.Backend, *layers.ParamSet, tp.Parallel, string, C) (L, error), name string, cfg C) func(tensor.Backend, *layers.ParamSet, tp.Parallel) (L, error) {
	return func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (L, error) {
		return newLayer(b, ps, par, name, cfg)
	}
}

// onRanksWith runs fn on every rank with the TP layer newLayer registers
// (materialized) and [lo, hi), the rows of the N tokens the rank holds: all
// of them, or its part under sequence parallelism.
func onRanksWith[L any](t *testing.T, s setup, N int, newLayer func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (L, error),
	fn func(r int, b tensor.Backend, l L, lo, hi int) error) {
	t.Helper()
	onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
		ps := layers.NewParamSet(seed)
		l, err := newLayer(b, ps, par)
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, s.dt); err != nil {
			return err
		}
		lo, hi := 0, N
		if s.sp {
			lo, hi = part(N, s.p, r)
		}
		return fn(r, b, l, lo, hi)
	})
}

// check runs l, the TP layer of rank r, forward from x into y and backward
// from dout into dx, and compares y and dx with wantY and wantDX and its
// parameters with the reference's (partial gradients go to partial).
func (ref reference) check(b tensor.Backend, l tpLayer, r int, x, y, dout, dx *tensor.Tensor, wantY, wantDX []float64,
	partial *partialSums, tol float64) error {
	if err := l.Forward(y, x); err != nil {
		return err
	}
	if err := testutil.Within("output", testutil.Download(b, y), wantY, tol); err != nil {
		return err
	}
	if err := l.Backward(dx, dout); err != nil {
		return err
	}
	if err := testutil.Within("input gradient", testutil.Download(b, dx), wantDX, tol); err != nil {
		return err
	}
	return checkShards(b, ref.params, l.Shards(), tol, partial, r)
}

// checkRowwise runs a reference layer and its TP version on x (N, C) with
// output gradient dout (N, C) in every setup, and compares the outputs, the
// input gradients and every parameter's weight and gradient. Under sequence
// parallelism each rank gets its rows of x and dout.
func checkRowwise[L tpLayer](t *testing.T, N, C int, newRef func(tensor.Backend, *layers.ParamSet) (rowLayer, error),
	newTP func(tensor.Backend, *layers.ParamSet, tp.Parallel) (L, error)) {
	forSetups(t, func(t *testing.T, s setup) {
		ref := runReference(t, s, N, C, C, newRef)
		partial := newPartial(s.p)
		onRanksWith(t, s, N, newTP, func(r int, b tensor.Backend, l L, lo, hi int) error {
			n := hi - lo
			x, dout := tens(s.dt, rowsOf(ref.x, C, lo, hi), n, C), tens(s.dt, rowsOf(ref.dout, C, lo, hi), n, C)
			y, dx := b.Zeros(s.dt, n, C), b.Zeros(s.dt, n, C)
			return ref.check(b, l, r, x, y, dout, dx, rowsOf(ref.y, C, lo, hi), rowsOf(ref.dx, C, lo, hi), partial, s.tol())
		})
		partial.check(t, ref.params, s.tol())
	})
}

// checkSequence is checkRowwise for layers of B sequences of T tokens of
// width C (attention, block).
func checkSequence[L seqLayer](t *testing.T, B, T, C int, newRef func(tensor.Backend, *layers.ParamSet) (rowLayer, error),
	newTP func(tensor.Backend, *layers.ParamSet, tp.Parallel) (L, error)) {
	checkRowwise(t, B*T, C, func(b tensor.Backend, ps *layers.ParamSet) (rowLayer, error) {
		l, err := newRef(b, ps)
		return in3D{l, B, T}, err
	}, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (batched, error) {
		l, err := newTP(b, ps, par)
		return batched{l, B, T}, err
	})
}

func TestAttentionMatchesLayers(t *testing.T) {
	cfg := layers.AttentionConfig{Dim: 32, Heads: 4, RopeTheta: 10000, Std: 0.3, OutStd: 0.2}
	checkSequence(t, 2, 8, 32, newRef(layers.NewAttention, "attn", cfg), newTP(tp.NewAttention, "attn", cfg))
}

func TestMLPMatchesLayers(t *testing.T) {
	cfg := layers.MLPConfig{Dim: 32, Hidden: 64, Std: 0.3, OutStd: 0.2}
	checkRowwise(t, 16, 32, newRef(layers.NewMLP, "mlp", cfg), newTP(tp.NewMLP, "mlp", cfg))
}

func TestBlockMatchesLayers(t *testing.T) {
	cfg := layers.BlockConfig{Dim: 32, Heads: 4, FFN: 64, RopeTheta: 10000, NormEps: 1e-5, Std: 0.3, OutStd: 0.2}
	checkSequence(t, 2, 8, 32, newRef(layers.NewBlock, "blk", cfg), newTP(tp.NewBlock, "blk", cfg))
}

func TestColumnParallelLinearMatchesLinear(t *testing.T) {
	const N, In, Out = 16, 12, 8
	for _, gather := range []bool{false, true} {
		t.Run(fmt.Sprint("gather=", gather), func(t *testing.T) {
			forSetups(t, func(t *testing.T, s setup) {
				ref := runReference(t, s, N, In, Out, newRef(layers.NewLinear, "lin", layers.LinearConfig{In: In, Out: Out, Bias: true, Std: 0.5}))
				onRanksWith(t, s, N, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (*tp.ColumnParallelLinear, error) {
					return tp.NewColumnParallelLinear(b, ps, par, "lin", tp.ColumnConfig{In: In, Out: Out, Bias: true, Std: 0.5, GatherOutput: gather})
				}, func(r int, b tensor.Backend, l *tp.ColumnParallelLinear, lo, hi int) error {
					clo, chi := part(Out, s.p, r)
					wantY, dyIn, w := colsOf(ref.y, Out, clo, chi), colsOf(ref.dout, Out, clo, chi), chi-clo
					if gather {
						wantY, dyIn, w = ref.y, ref.dout, Out
					}
					x, dy := tens(s.dt, rowsOf(ref.x, In, lo, hi), hi-lo, In), tens(s.dt, dyIn, N, w)
					y, dx := b.Zeros(s.dt, N, w), b.Zeros(s.dt, hi-lo, In)
					return ref.check(b, l, r, x, y, dy, dx, wantY, rowsOf(ref.dx, In, lo, hi), nil, s.tol())
				})
			})
		})
	}
}

func TestRowParallelLinearMatchesLinear(t *testing.T) {
	const N, In, Out = 16, 16, 12
	forSetups(t, func(t *testing.T, s setup) {
		ref := runReference(t, s, N, In, Out, newRef(layers.NewLinear, "lin", layers.LinearConfig{In: In, Out: Out, Bias: true, Std: 0.5}))
		partial := newPartial(s.p)
		onRanksWith(t, s, N, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (*tp.RowParallelLinear, error) {
			return tp.NewRowParallelLinear(b, ps, par, "lin", tp.RowConfig{In: In, Out: Out, Bias: true, Std: 0.5})
		}, func(r int, b tensor.Backend, l *tp.RowParallelLinear, lo, hi int) error {
			clo, chi := part(In, s.p, r)
			x, dy := tens(s.dt, colsOf(ref.x, In, clo, chi), N, chi-clo), tens(s.dt, rowsOf(ref.dout, Out, lo, hi), hi-lo, Out)
			y, dx := b.Zeros(s.dt, hi-lo, Out), b.Zeros(s.dt, N, chi-clo)
			return ref.check(b, l, r, x, y, dy, dx, rowsOf(ref.y, Out, lo, hi), colsOf(ref.dx, In, clo, chi), partial, s.tol())
		})
		partial.check(t, ref.params, s.tol())
	})
}

func TestVocabParallelEmbeddingMatchesEmbedding(t *testing.T) {
	const B, T, V, C = 2, 8, 64, 12
	forSetups(t, func(t *testing.T, s setup) {
		b := cpu.New()
		ps := layers.NewParamSet(seed)
		emb, err := layers.NewEmbedding(b, ps, "embed", V, C, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Materialize(b, s.dt); err != nil {
			t.Fatal(err)
		}
		ids := testutil.RandInts(testutil.Rng(3), V, B, T)
		ids.I32()[0], ids.I32()[1] = ids.I32()[5], ids.I32()[5] // repeated ids add up
		dout := random(2, s.dt, B, T, C)
		out := b.Zeros(s.dt, B, T, C)
		if err := emb.Forward(out, ids); err != nil {
			t.Fatal(err)
		}
		if err := emb.Backward(dout); err != nil {
			t.Fatal(err)
		}
		ref := refOf(b, ps)
		ov, dov := testutil.Download(b, out), testutil.Download(b, dout)
		onRanksWith(t, s, B*T, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (*tp.VocabParallelEmbedding, error) {
			return tp.NewVocabParallelEmbedding(b, ps, par, "embed", V, C, 0.5)
		}, func(r int, b tensor.Backend, e *tp.VocabParallelEmbedding, lo, hi int) error {
			out := b.Zeros(s.dt, hi-lo, C)
			if err := e.Forward(out, ids); err != nil {
				return err
			}
			if err := testutil.Within("output", testutil.Download(b, out), rowsOf(ov, C, lo, hi), 0); err != nil {
				return err
			}
			if err := e.Backward(tens(s.dt, rowsOf(dov, C, lo, hi), hi-lo, C)); err != nil {
				return err
			}
			return checkShards(b, ref, e.Shards(), s.tol(), nil, r)
		})
	})
}

func TestVocabParallelCrossEntropyMatchesCrossEntropy(t *testing.T) {
	const N, V = 16, 64
	const gradScale = float32(1.0 / 13)
	forSetups(t, func(t *testing.T, s setup) {
		if s.sp {
			t.Skip("sequence parallelism does not change the loss (the logits have all N rows)")
		}
		b := cpu.New()
		logits := random(1, s.dt, N, V)
		b.Scale(logits, logits, 4) // spread the softmax
		targets := testutil.RandInts(testutil.Rng(5), V, N)
		targets.I32()[3], targets.I32()[9] = -1, -7 // ignored rows
		losses := b.Zeros(tensor.Float64, N)
		if s.dt == tensor.Float32 {
			losses = b.Zeros(tensor.Float32, N)
		}
		dlogits := b.Zeros(s.dt, N, V)
		b.CrossEntropy(losses, dlogits, logits, targets, gradScale)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		lv, lgv, dv := testutil.Download(b, losses), testutil.Download(b, logits), testutil.Download(b, dlogits)
		onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
			ce, err := tp.NewVocabParallelCrossEntropy(b, par, V)
			if err != nil {
				return err
			}
			clo, chi := part(V, s.p, r)
			// N rows twice (the second call reuses the scratch), then fewer
			// rows (reallocated), each against the same rows of the reference.
			for _, n := range []int{N, N, 7} {
				losses := b.Zeros(layerkit.StatDType(s.dt), n)
				dlogits := b.Zeros(s.dt, n, chi-clo)
				tg, err := tensor.FromInt32(targets.I32()[:n], n)
				if err != nil {
					return err
				}
				if err := ce.Forward(losses, dlogits, tens(s.dt, colsOf(lgv[:n*V], V, clo, chi), n, chi-clo), tg, gradScale); err != nil {
					return err
				}
				if err := testutil.Within(fmt.Sprintf("losses of %d rows", n), testutil.Download(b, losses), lv[:n], s.tol()); err != nil {
					return err
				}
				if err := testutil.Within(fmt.Sprintf("dlogits of %d rows", n), testutil.Download(b, dlogits), colsOf(dv[:n*V], V, clo, chi), s.tol()); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// TestLinearStdRefused: the parallel linears refuse a weight of standard
// deviation 0 naming their config's field, and take Init: Constant(0) for
// zero weights.
func TestLinearStdRefused(t *testing.T) {
	onRanks(t, setup{p: 2, dt: tensor.Float32}, func(r int, par tp.Parallel, b tensor.Backend) error {
		ps := layers.NewParamSet(seed)
		_, err := tp.NewColumnParallelLinear(b, ps, par, "col", tp.ColumnConfig{In: 4, Out: 6})
		if err == nil || !strings.Contains(err.Error(), "ColumnConfig.Std = 0") {
			return fmt.Errorf("column-parallel linear of Std 0: %v, want an error naming ColumnConfig.Std", err)
		}
		_, err = tp.NewRowParallelLinear(b, ps, par, "row", tp.RowConfig{In: 6, Out: 4})
		if err == nil || !strings.Contains(err.Error(), "RowConfig.Std = 0") {
			return fmt.Errorf("row-parallel linear of Std 0: %v, want an error naming RowConfig.Std", err)
		}
		row, err := tp.NewRowParallelLinear(b, ps, par, "row", tp.RowConfig{In: 6, Out: 4, Init: layers.Constant(0)})
		if err != nil {
			return err
		}
		if err := ps.Materialize(b, tensor.Float32); err != nil {
			return err
		}
		for _, v := range testutil.Download(b, row.W.W) {
			if v != 0 {
				return fmt.Errorf("Init: Constant(0) gave a weight of %v", v)
			}
		}
		return nil
	})
}
