package tp_test

import (
	"fmt"
	"testing"

	"github.com/asynctp/asynctp/internal/testutil"
	"github.com/asynctp/asynctp/layers"
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

// pass is the forward and backward of a layer that maps rows of C to rows
// of C (attention, MLP, block), as closures.
type pass struct {
	fwd    func(out, x *tensor.Tensor) error
	bwd    func(dx, dout *tensor.Tensor) error
	shards func() []tp.Shard
}

// checkRowwise runs a reference layer and its TP version on x (N, C) with
// output gradient dout (N, C), and compares the outputs, the input
// gradients and every parameter's weight and gradient. Under sequence
// parallelism each rank gets its rows of x and dout.
func checkRowwise(t *testing.T, s setup, N, C int, ref func(b tensor.Backend, ps *layers.ParamSet) (pass, error),
	par func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (pass, error)) {
	t.Helper()
	b := cpu.New()
	ps := layers.NewParamSet(seed)
	rl, err := ref(b, ps)
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, s.dt); err != nil {
		t.Fatal(err)
	}
	x, dout := random(1, s.dt, N, C), random(2, s.dt, N, C)
	y, dx := b.Zeros(s.dt, N, C), b.Zeros(s.dt, N, C)
	if err := rl.fwd(y, x); err != nil {
		t.Fatal(err)
	}
	if err := rl.bwd(dx, dout); err != nil {
		t.Fatal(err)
	}
	refP := refOf(b, ps)
	xv, yv, dxv, dov := values(b, x), values(b, y), values(b, dx), values(b, dout)
	partial := newPartial(s.p)
	onRanks(t, s, func(r int, p tp.Parallel, b tensor.Backend) error {
		ps := layers.NewParamSet(seed)
		l, err := par(b, ps, p)
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
		n := hi - lo
		x := tens(s.dt, rowsOf(xv, C, lo, hi), n, C)
		y, dx := b.Zeros(s.dt, n, C), b.Zeros(s.dt, n, C)
		if err := l.fwd(y, x); err != nil {
			return err
		}
		if err := closeTo("output", values(b, y), rowsOf(yv, C, lo, hi), s.tol()); err != nil {
			return err
		}
		if err := l.bwd(dx, tens(s.dt, rowsOf(dov, C, lo, hi), n, C)); err != nil {
			return err
		}
		if err := closeTo("input gradient", values(b, dx), rowsOf(dxv, C, lo, hi), s.tol()); err != nil {
			return err
		}
		return checkShards(b, refP, l.shards(), s.tol(), partial, r)
	})
	partial.check(t, refP, s.tol())
}

func TestAttentionMatchesLayers(t *testing.T) {
	const B, T, C, H = 2, 8, 32, 4
	cfg := layers.AttentionConfig{Dim: C, Heads: H, RopeTheta: 10000, Std: 0.3, OutStd: 0.2}
	forSetups(t, func(t *testing.T, s setup) {
		checkRowwise(t, s, B*T, C, func(b tensor.Backend, ps *layers.ParamSet) (pass, error) {
			a, err := layers.NewAttention(b, ps, "attn", cfg)
			if err != nil {
				return pass{}, err
			}
			r3 := func(x *tensor.Tensor) *tensor.Tensor { v, _ := x.Reshape(B, T, C); return v }
			return pass{
				fwd: func(out, x *tensor.Tensor) error { return a.Forward(r3(out), r3(x)) },
				bwd: func(dx, dout *tensor.Tensor) error { return a.Backward(r3(dx), r3(dout)) },
			}, nil
		}, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (pass, error) {
			a, err := tp.NewAttention(b, ps, par, "attn", cfg)
			if err != nil {
				return pass{}, err
			}
			return pass{
				fwd:    func(out, x *tensor.Tensor) error { return a.Forward(out, x, B, T) },
				bwd:    a.Backward,
				shards: a.Shards,
			}, nil
		})
	})
}

func TestMLPMatchesLayers(t *testing.T) {
	const N, C, F = 16, 32, 64
	cfg := layers.MLPConfig{Dim: C, Hidden: F, Std: 0.3, OutStd: 0.2}
	forSetups(t, func(t *testing.T, s setup) {
		checkRowwise(t, s, N, C, func(b tensor.Backend, ps *layers.ParamSet) (pass, error) {
			m, err := layers.NewMLP(b, ps, "mlp", cfg)
			if err != nil {
				return pass{}, err
			}
			return pass{fwd: m.Forward, bwd: m.Backward}, nil
		}, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (pass, error) {
			m, err := tp.NewMLP(b, ps, par, "mlp", cfg)
			if err != nil {
				return pass{}, err
			}
			return pass{fwd: m.Forward, bwd: m.Backward, shards: m.Shards}, nil
		})
	})
}

func TestBlockMatchesLayers(t *testing.T) {
	const B, T, C = 2, 8, 32
	cfg := layers.BlockConfig{Dim: C, Heads: 4, FFN: 64, RopeTheta: 10000, NormEps: 1e-5, Std: 0.3, OutStd: 0.2}
	forSetups(t, func(t *testing.T, s setup) {
		checkRowwise(t, s, B*T, C, func(b tensor.Backend, ps *layers.ParamSet) (pass, error) {
			blk, err := layers.NewBlock(b, ps, "blk", cfg)
			if err != nil {
				return pass{}, err
			}
			r3 := func(x *tensor.Tensor) *tensor.Tensor { v, _ := x.Reshape(B, T, C); return v }
			return pass{
				fwd: func(out, x *tensor.Tensor) error { return blk.Forward(r3(out), r3(x)) },
				bwd: func(dx, dout *tensor.Tensor) error { return blk.Backward(r3(dx), r3(dout)) },
			}, nil
		}, func(b tensor.Backend, ps *layers.ParamSet, par tp.Parallel) (pass, error) {
			blk, err := tp.NewBlock(b, ps, par, "blk", cfg)
			if err != nil {
				return pass{}, err
			}
			return pass{
				fwd:    func(out, x *tensor.Tensor) error { return blk.Forward(out, x, B, T) },
				bwd:    blk.Backward,
				shards: blk.Shards,
			}, nil
		})
	})
}

func TestColumnParallelLinearMatchesLinear(t *testing.T) {
	const N, In, Out = 16, 12, 8
	for _, gather := range []bool{false, true} {
		t.Run(fmt.Sprint("gather=", gather), func(t *testing.T) {
			forSetups(t, func(t *testing.T, s setup) {
				b := cpu.New()
				ps := layers.NewParamSet(seed)
				lin, err := layers.NewLinear(b, ps, "lin", layers.LinearConfig{In: In, Out: Out, Bias: true, Std: 0.5})
				if err != nil {
					t.Fatal(err)
				}
				if err := ps.Materialize(b, s.dt); err != nil {
					t.Fatal(err)
				}
				x, dy := random(1, s.dt, N, In), random(2, s.dt, N, Out)
				y, dx := b.Zeros(s.dt, N, Out), b.Zeros(s.dt, N, In)
				if err := lin.Forward(y, x); err != nil {
					t.Fatal(err)
				}
				if err := lin.Backward(dx, dy); err != nil {
					t.Fatal(err)
				}
				ref := refOf(b, ps)
				xv, yv, dxv, dyv := values(b, x), values(b, y), values(b, dx), values(b, dy)
				onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
					ps := layers.NewParamSet(seed)
					l, err := tp.NewColumnParallelLinear(b, ps, par, "lin", tp.ColumnConfig{In: In, Out: Out, Bias: true, Std: 0.5, GatherOutput: gather})
					if err != nil {
						return err
					}
					if err := ps.Materialize(b, s.dt); err != nil {
						return err
					}
					lo, hi := 0, N // this rank's tokens
					if s.sp {
						lo, hi = part(N, s.p, r)
					}
					clo, chi := part(Out, s.p, r)
					wantY, dyIn, w := colsOf(yv, Out, clo, chi), colsOf(dyv, Out, clo, chi), chi-clo
					if gather {
						wantY, dyIn, w = yv, dyv, Out
					}
					x := tens(s.dt, rowsOf(xv, In, lo, hi), hi-lo, In)
					y, dx := b.Zeros(s.dt, N, w), b.Zeros(s.dt, hi-lo, In)
					if err := l.Forward(y, x); err != nil {
						return err
					}
					if err := closeTo("output", values(b, y), wantY, s.tol()); err != nil {
						return err
					}
					if err := l.Backward(dx, tens(s.dt, dyIn, N, w)); err != nil {
						return err
					}
					if err := closeTo("input gradient", values(b, dx), rowsOf(dxv, In, lo, hi), s.tol()); err != nil {
						return err
					}
					return checkShards(b, ref, l.Shards(), s.tol(), nil, r)
				})
			})
		})
	}
}

func TestRowParallelLinearMatchesLinear(t *testing.T) {
	const N, In, Out = 16, 16, 12
	forSetups(t, func(t *testing.T, s setup) {
		b := cpu.New()
		ps := layers.NewParamSet(seed)
		lin, err := layers.NewLinear(b, ps, "lin", layers.LinearConfig{In: In, Out: Out, Bias: true, Std: 0.5})
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Materialize(b, s.dt); err != nil {
			t.Fatal(err)
		}
		x, dy := random(1, s.dt, N, In), random(2, s.dt, N, Out)
		y, dx := b.Zeros(s.dt, N, Out), b.Zeros(s.dt, N, In)
		if err := lin.Forward(y, x); err != nil {
			t.Fatal(err)
		}
		if err := lin.Backward(dx, dy); err != nil {
			t.Fatal(err)
		}
		ref := refOf(b, ps)
		xv, yv, dxv, dyv := values(b, x), values(b, y), values(b, dx), values(b, dy)
		partial := newPartial(s.p)
		onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
			ps := layers.NewParamSet(seed)
			l, err := tp.NewRowParallelLinear(b, ps, par, "lin", tp.RowConfig{In: In, Out: Out, Bias: true, Std: 0.5})
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
			clo, chi := part(In, s.p, r)
			y, dx := b.Zeros(s.dt, hi-lo, Out), b.Zeros(s.dt, N, chi-clo)
			if err := l.Forward(y, tens(s.dt, colsOf(xv, In, clo, chi), N, chi-clo)); err != nil {
				return err
			}
			if err := closeTo("output", values(b, y), rowsOf(yv, Out, lo, hi), s.tol()); err != nil {
				return err
			}
			if err := l.Backward(dx, tens(s.dt, rowsOf(dyv, Out, lo, hi), hi-lo, Out)); err != nil {
				return err
			}
			if err := closeTo("input gradient", values(b, dx), colsOf(dxv, In, clo, chi), s.tol()); err != nil {
				return err
			}
			return checkShards(b, ref, l.Shards(), s.tol(), partial, r)
		})
		partial.check(t, ref, s.tol())
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
		ov, dov := values(b, out), values(b, dout)
		onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
			ps := layers.NewParamSet(seed)
			e, err := tp.NewVocabParallelEmbedding(b, ps, par, "embed", V, C, 0.5)
			if err != nil {
				return err
			}
			if err := ps.Materialize(b, s.dt); err != nil {
				return err
			}
			lo, hi := 0, B*T
			if s.sp {
				lo, hi = part(B*T, s.p, r)
			}
			out := b.Zeros(s.dt, hi-lo, C)
			if err := e.Forward(out, ids); err != nil {
				return err
			}
			if err := closeTo("output", values(b, out), rowsOf(ov, C, lo, hi), 0); err != nil {
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
		lv, lgv, dv := values(b, losses), values(b, logits), values(b, dlogits)
		onRanks(t, s, func(r int, par tp.Parallel, b tensor.Backend) error {
			ce, err := tp.NewVocabParallelCrossEntropy(b, par, V)
			if err != nil {
				return err
			}
			clo, chi := part(V, s.p, r)
			losses := tensor.MustHost(tensor.Float64, N)
			dlogits := b.Zeros(s.dt, N, chi-clo)
			for range 2 { // the second call reuses the scratch
				if err := ce.Forward(losses, dlogits, tens(s.dt, colsOf(lgv, V, clo, chi), N, chi-clo), targets, gradScale); err != nil {
					return err
				}
			}
			if err := closeTo("losses", losses.F64(), lv, s.tol()); err != nil {
				return err
			}
			return closeTo("dlogits", values(b, dlogits), colsOf(dv, V, clo, chi), s.tol())
		})
	})
}
