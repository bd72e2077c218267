package cudabackend

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// pairT is a device tensor and the float64 host copy of its values.
type pairT struct {
	dev *tensor.Tensor
	ref *tensor.Tensor
}

// randPair uploads random values of magnitude [0.1, 1) rounded to dt.
func randPair(t *testing.T, b *Backend, rng interface{ Float64() float64 }, dt tensor.DType, shape ...int) pairT {
	t.Helper()
	host := tensor.MustHost(dt, shape...)
	vals := make([]float64, host.Numel())
	for i := range vals {
		v := 0.1 + 0.9*rng.Float64()
		if rng.Float64() < 0.5 {
			v = -v
		}
		vals[i] = v
	}
	if err := host.SetFloat64s(vals); err != nil {
		t.Fatal(err)
	}
	dev := b.Zeros(dt, shape...)
	b.Upload(dev, host)
	ref := tensor.MustHost(tensor.Float64, shape...)
	rounded, _ := host.Float64s()
	copy(ref.F64(), rounded)
	return pairT{dev, ref}
}

// values downloads a device tensor as float64.
func values(t *testing.T, b *Backend, x *tensor.Tensor) []float64 {
	t.Helper()
	host := tensor.MustHost(x.DType(), x.Shape()...)
	b.Download(host, x)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	v, err := host.Float64s()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func closeTo(t *testing.T, name string, got, want []float64, tol float64) {
	t.Helper()
	if e := testutil.RelErr(got, want); !(e <= tol) {
		t.Errorf("%s: relative error %.3g > %.3g; got %v..., want %v...", name, e, tol, got[:min(4, len(got))], want[:min(4, len(want))])
	}
}

// attnShape is an attention problem: B sequences of T positions, H query
// heads and Hkv key/value heads (Hkv dividing H) of D features.
type attnShape struct{ nb, nt, nh, hkv, d int }

func (s attnShape) String() string {
	return fmt.Sprintf("B=%d,T=%d,H=%d,Hkv=%d,D=%d", s.nb, s.nt, s.nh, s.hkv, s.d)
}

// mha is s's multi-head shapes (Hkv = H) from (B, T, H, D).
func mha(shapes ...[4]int) []attnShape {
	out := make([]attnShape, len(shapes))
	for i, s := range shapes {
		out[i] = attnShape{s[0], s[1], s[2], s[2], s[3]}
	}
	return out
}

// attnShapes are runAttentionShapes': head dims and lengths that exercise
// the tensor-core kernels' tiles (D = 64, 128; T not a multiple of 64; the
// edges of attention_fa2.cu's 128-row tiles), multi-head, and grouped-query
// with groups of 2, 4 and 8 query heads per key/value head at both head
// dims (one or two tiles of queries per head, so the dk/dv pass streams
// several heads' tiles, with and without tiles past the diagonal).
var attnShapes = append(mha([4]int{2, 70, 3, 64}, [4]int{1, 130, 2, 128}, [4]int{1, 64, 1, 64}, [4]int{1, 17, 2, 128},
	[4]int{1, 100, 1, 40}, [4]int{2, 1, 2, 64}, [4]int{1, 63, 2, 128}, [4]int{2, 65, 2, 64}, [4]int{1, 200, 2, 64},
	[4]int{1, 200, 2, 128}, [4]int{1, 300, 1, 64}),
	attnShape{1, 130, 2, 1, 64}, attnShape{2, 33, 4, 2, 128}, attnShape{1, 70, 4, 1, 64}, attnShape{1, 65, 4, 1, 128},
	attnShape{1, 40, 8, 1, 64}, attnShape{1, 40, 8, 1, 128}, attnShape{1, 50, 4, 2, 40})

// runAttentionShapes checks attention forward and backward against the CPU
// reference (float64) at attnShapes, in bf16, and in f32 without options:
// f32 takes the CUDA-core kernels whatever WithAttention says, so the
// variants with an option would run the same kernels again. Outputs start
// as NaN, so an element left unwritten fails.
func runAttentionShapes(t *testing.T, open opener, opts ...Option) {
	dts := []tensor.DType{tensor.BFloat16}
	if len(opts) == 0 {
		dts = append(dts, tensor.Float32)
	}
	for _, dt := range dts {
		tol := 1e-2
		if dt == tensor.Float32 {
			tol = 1e-5
		}
		for _, s := range attnShapes {
			t.Run(fmt.Sprintf("%v/%v", dt, s), func(t *testing.T) {
				b := open(t, opts...)
				ref := cpu.New()
				rng := testutil.Rng(uint64(s.nt*1000 + s.d + 7*(s.nh-s.hkv))) // multi-head: the seeds these shapes always had
				nb, nt, nh, d := s.nb, s.nt, s.nh, s.d
				qs, kvs := []int{nb, nt, nh, d}, []int{nb, nt, s.hkv, d}
				scale := float32(1 / math.Sqrt(float64(d)))
				q, k, v := randPair(t, b, rng, dt, qs...), randPair(t, b, rng, dt, kvs...), randPair(t, b, rng, dt, kvs...)
				// Peaked softmax, as in the conformance suite.
				b.Scale(q.dev, q.dev, 3)
				ref.Scale(q.ref, q.ref, 3)
				out, lse := b.Zeros(dt, qs...), b.Zeros(tensor.Float32, nb, nh, nt)
				b.Fill(out, math.NaN())
				b.Fill(lse, math.NaN())
				rout, rlse := tensor.MustHost(tensor.Float64, qs...), tensor.MustHost(tensor.Float64, nb, nh, nt)
				b.Attention(out, lse, q.dev, k.dev, v.dev, scale)
				ref.Attention(rout, rlse, q.ref, k.ref, v.ref, scale)
				closeTo(t, "out", values(t, b, out), rout.F64(), tol)
				closeTo(t, "lse", values(t, b, lse), rlse.F64(), tol)

				dout := randPair(t, b, rng, dt, qs...)
				// The reference backward uses the backend's own out (as a layer would).
				outRef := tensor.MustHost(tensor.Float64, qs...)
				copy(outRef.F64(), values(t, b, out))
				lseRef := tensor.MustHost(tensor.Float64, nb, nh, nt)
				copy(lseRef.F64(), values(t, b, lse))
				dq, dk, dv := b.Zeros(dt, qs...), b.Zeros(dt, kvs...), b.Zeros(dt, kvs...)
				for _, x := range []*tensor.Tensor{dq, dk, dv} {
					b.Fill(x, math.NaN())
				}
				rdq, rdk, rdv := tensor.MustHost(tensor.Float64, qs...), tensor.MustHost(tensor.Float64, kvs...), tensor.MustHost(tensor.Float64, kvs...)
				b.AttentionBackward(dq, dk, dv, dout.dev, q.dev, k.dev, v.dev, out, lse, scale)
				ref.AttentionBackward(rdq, rdk, rdv, dout.ref, q.ref, k.ref, v.ref, outRef, lseRef, scale)
				if err := ref.Err(); err != nil {
					t.Fatal(err)
				}
				closeTo(t, "dq", values(t, b, dq), rdq.F64(), tol)
				closeTo(t, "dk", values(t, b, dk), rdk.F64(), tol)
				closeTo(t, "dv", values(t, b, dv), rdv.F64(), tol)
			})
		}
	}
}

// runAttentionSameBits runs attention forward and backward with the FA2
// kernels (mma.sync) and with the wgmma backward on the same random bf16
// inputs and requires the same bits: both sum each product over 16-wide k
// slices in the same order, tile by tile in the same order (the group's
// query heads in the same order for dk, dv), and share the softmax code, so
// nothing but the instruction differs. (The CPU comparison of
// runAttentionShapes checks both against float64.)
func runAttentionSameBits(t *testing.T, open opener) {
	runAttentionSameBitsAt(t, open, append(mha([4]int{2, 300, 3, 64}, [4]int{1, 200, 2, 128}, [4]int{1, 1024, 2, 64}, [4]int{2, 65, 1, 128}),
		attnShape{1, 70, 2, 1, 64}, attnShape{1, 40, 2, 1, 128}))
}

// runAttentionSameBitsAt: FA2 and the wgmma kernels give the same bits
// (out, lse, dq, dk, dv) at shapes.
func runAttentionSameBitsAt(t *testing.T, open opener, shapes []attnShape) {
	for _, s := range shapes {
		t.Run(s.String(), func(t *testing.T) {
			nb, nt, nh, d := s.nb, s.nt, s.nh, s.d
			qs, kvs := []int{nb, nt, nh, d}, []int{nb, nt, s.hkv, d}
			scale := float32(1 / math.Sqrt(float64(d)))
			run := func(opt AttentionImpl) [][]float64 {
				b := open(t, WithAttention(opt))
				if opt == AttentionWGMMA && !b.useWG() {
					t.Fatalf("the wgmma kernels do not run on %s", b.DeviceName())
				}
				rng := testutil.Rng(uint64(nt*10 + d))
				q, k, v, dout := randPair(t, b, rng, tensor.BFloat16, qs...), randPair(t, b, rng, tensor.BFloat16, kvs...),
					randPair(t, b, rng, tensor.BFloat16, kvs...), randPair(t, b, rng, tensor.BFloat16, qs...)
				b.Scale(q.dev, q.dev, 3)
				out, lse := b.Zeros(tensor.BFloat16, qs...), b.Zeros(tensor.Float32, nb, nh, nt)
				b.Attention(out, lse, q.dev, k.dev, v.dev, scale)
				dq, dk, dv := b.Zeros(tensor.BFloat16, qs...), b.Zeros(tensor.BFloat16, kvs...), b.Zeros(tensor.BFloat16, kvs...)
				b.AttentionBackward(dq, dk, dv, dout.dev, q.dev, k.dev, v.dev, out, lse, scale)
				return [][]float64{values(t, b, out), values(t, b, lse), values(t, b, dq), values(t, b, dk), values(t, b, dv)}
			}
			fa2, wg := run(AttentionFA2), run(AttentionWGMMA)
			for i, name := range []string{"out", "lse", "dq", "dk", "dv"} {
				diff, worst := 0, 0.0
				for j := range fa2[i] {
					if math.Float64bits(fa2[i][j]) != math.Float64bits(wg[i][j]) {
						diff++
						worst = math.Max(worst, math.Abs(fa2[i][j]-wg[i][j]))
					}
				}
				if diff > 0 {
					t.Errorf("%s: %d of %d elements differ between FA2 and wgmma (largest difference %.3g)", name, diff, len(fa2[i]), worst)
				}
			}
		})
	}
}

// runRoPEShapes checks RoPE and its backward against the CPU reference on
// head dims the vectorised bf16 kernel takes (D % 16 == 0) and one it does
// not, in place and out of place.
func runRoPEShapes(t *testing.T, open opener, opts ...Option) {
	for _, dt := range []tensor.DType{tensor.BFloat16, tensor.Float32} {
		tol := 1e-2
		if dt == tensor.Float32 {
			tol = 1e-5
		}
		for _, s := range [][4]int{{2, 37, 3, 64}, {1, 19, 2, 128}, {1, 5, 2, 48}, {2, 7, 3, 18}} {
			t.Run(fmt.Sprintf("%v/%v", dt, s), func(t *testing.T) {
				b := open(t, opts...)
				ref := cpu.New()
				rng := testutil.Rng(uint64(s[1]*100 + s[3]))
				const theta = 1e4
				x := randPair(t, b, rng, dt, s[:]...)
				out := b.Zeros(dt, s[:]...)
				b.Fill(out, math.NaN())
				rout := tensor.MustHost(tensor.Float64, s[:]...)
				b.RoPE(out, x.dev, theta)
				ref.RoPE(rout, x.ref, theta)
				closeTo(t, "RoPE", values(t, b, out), rout.F64(), tol)
				rdx := tensor.MustHost(tensor.Float64, s[:]...)
				ref.RoPEBackward(rdx, x.ref, theta)
				b.RoPEBackward(x.dev, x.dev, theta) // in place
				closeTo(t, "RoPEBackward", values(t, b, x.dev), rdx.F64(), tol)
				if err := ref.Err(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
