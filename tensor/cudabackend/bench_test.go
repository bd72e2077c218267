package cudabackend

import (
	"fmt"
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// Benchmarks on the GPU (they skip without one). Each queues b.N ops and
// synchronises once, so the figures are device throughput with the host's
// launch overhead hidden; rates are reported as TFLOP/s (matrix work) or
// GB/s (bytes read and written once).
//
//	./build/cudabackend.test -test.run '^$' -test.bench . -test.benchtime 20x

func benchRand(b *testing.B, be *Backend, dt tensor.DType, shape ...int) *tensor.Tensor {
	b.Helper()
	x := be.Zeros(dt, shape...)
	be.Upload(x, testutil.Rand(testutil.Rng(1), dt, shape...))
	return x
}

// timeIt runs op b.N times after a warm-up and reports work/second in unit.
func timeIt(b *testing.B, be *Backend, work float64, unit string, op func()) {
	b.Helper()
	op()
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		op()
	}
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(work*float64(b.N)/b.Elapsed().Seconds(), unit)
}

// BenchmarkAttention times the causal attention forward and backward on
// the shapes of the presets (gpt2-124m: B 16, T 1024, H 12, D 64; the
// 1B-class preset: B 8, T 2048, H 16, D 128) and a grouped-query one
// (llama-1b's with 4 key/value heads, groups of 4) with each
// implementation: wg (the default on sm_90: the fa2 forward at D = 64, the
// wgmma forward at D = 128 and the wgmma backward of attention_wg.cu,
// AttentionWGMMA), fa2 (attention_fa2.cu both ways, AttentionFA2), fa2w8
// (its D = 64 forward with 8 warps × 16 rows), simt. FLOPs are the causal
// ones: 2 GEMMs of half the T×T scores forward, 5 backward (per query head:
// grouped-query attention does as many).
//
//	./build/tensor_cudabackend.test -test.run '^$' -test.bench Attention -test.benchtime 20x
func BenchmarkAttention(b *testing.B) {
	shapes := []struct {
		name               string
		nb, nt, nh, hkv, d int
	}{{"gpt2", 16, 1024, 12, 12, 64}, {"1b", 8, 2048, 16, 16, 128}, {"1b-gqa4", 8, 2048, 16, 4, 128}}
	for _, impl := range []struct {
		name string
		opt  AttentionImpl
		w8   bool // the D = 64 forward with 8 warps
	}{{"wg", AttentionWGMMA, false}, {"fa2", AttentionFA2, false}, {"fa2w8", AttentionFA2, true}, {"simt", AttentionSIMT, false}} {
		for _, sh := range shapes {
			nb, nt, nh, hkv, d := sh.nb, sh.nt, sh.nh, sh.hkv, sh.d
			if impl.w8 && d != 64 {
				continue
			}
			b.Run(fmt.Sprintf("%s/%s/B=%d,T=%d,H=%d,Hkv=%d,D=%d", impl.name, sh.name, nb, nt, nh, hkv, d), func(b *testing.B) {
				if impl.w8 {
					fa2FwdD64Warps = 8
					defer func() { fa2FwdD64Warps = 4 }()
				}
				be := openGPU(b, WithAttention(impl.opt))
				q, k, v := benchRand(b, be, tensor.BFloat16, nb, nt, nh, d), benchRand(b, be, tensor.BFloat16, nb, nt, hkv, d), benchRand(b, be, tensor.BFloat16, nb, nt, hkv, d)
				out, lse := be.Zeros(tensor.BFloat16, nb, nt, nh, d), be.Zeros(tensor.Float32, nb, nh, nt)
				scale := float32(1 / math.Sqrt(float64(d)))
				fwd := 2 * 2 * float64(nb*nh) * float64(nt) * float64(nt) / 2 * float64(d)
				b.Run("fwd", func(b *testing.B) {
					timeIt(b, be, fwd/1e12, "TFLOP/s", func() { be.Attention(out, lse, q, k, v, scale) })
				})
				dout := benchRand(b, be, tensor.BFloat16, nb, nt, nh, d)
				dq, dk, dv := be.Zeros(tensor.BFloat16, nb, nt, nh, d), be.Zeros(tensor.BFloat16, nb, nt, hkv, d), be.Zeros(tensor.BFloat16, nb, nt, hkv, d)
				b.Run("bwd", func(b *testing.B) {
					timeIt(b, be, 2.5*fwd/1e12, "TFLOP/s", func() {
						be.AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, scale)
					})
				})
				b.Run("rope", func(b *testing.B) {
					// q and k, as a layer does: read and write 2 bytes each.
					timeIt(b, be, 2*2*float64(nb*nt*(nh+hkv)*d)/1e9, "GB/s", func() {
						be.RoPE(q, q, 1e4)
						be.RoPE(k, k, 1e4)
					})
				})
			})
		}
	}
}

func BenchmarkMatMul(b *testing.B) {
	be := openGPU(b)
	const m, n, k = 4096, 4096, 4096
	a, w, c := benchRand(b, be, tensor.BFloat16, m, k), benchRand(b, be, tensor.BFloat16, k, n), be.Zeros(tensor.BFloat16, m, n)
	timeIt(b, be, 2*m*n*k/1e12, "TFLOP/s", func() { be.MatMul(c, a, w, false, false, 1, 0) })
}

func BenchmarkRMSNorm(b *testing.B) {
	be := openGPU(b)
	const n, c = 16384, 4096
	x, w := benchRand(b, be, tensor.BFloat16, n, c), benchRand(b, be, tensor.BFloat16, c)
	out, rstd := be.Zeros(tensor.BFloat16, n, c), be.Zeros(tensor.Float32, n)
	b.Run("fwd", func(b *testing.B) {
		timeIt(b, be, 2*2*n*c/1e9, "GB/s", func() { be.RMSNorm(out, rstd, x, w, 1e-5) })
	})
	dout, dx, dw := benchRand(b, be, tensor.BFloat16, n, c), be.Zeros(tensor.BFloat16, n, c), be.Zeros(tensor.BFloat16, c)
	b.Run("bwd", func(b *testing.B) {
		timeIt(b, be, 3*2*n*c/1e9, "GB/s", func() { be.RMSNormBackward(dx, dw, dout, x, w, rstd) })
	})
}

func BenchmarkCrossEntropy(b *testing.B) {
	be := openGPU(b)
	const n, v = 8192, 50304
	logits := benchRand(b, be, tensor.BFloat16, n, v)
	dlogits, losses := be.Zeros(tensor.BFloat16, n, v), be.Zeros(tensor.Float32, n)
	targets := be.Zeros(tensor.Int32, n)
	be.Upload(targets, testutil.RandInts(testutil.Rng(2), v, n))
	timeIt(b, be, 3*2*n*v/1e9, "GB/s", func() { be.CrossEntropy(losses, dlogits, logits, targets, 1.0/n) })
}

func BenchmarkAdamW(b *testing.B) {
	be := openGPU(b)
	const n = 64 << 20
	p, g := benchRand(b, be, tensor.BFloat16, n), benchRand(b, be, tensor.BFloat16, n)
	m, v, master := be.Zeros(tensor.Float32, n), be.Zeros(tensor.Float32, n), benchRand(b, be, tensor.Float32, n)
	hp := tensor.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}
	// Reads g (2 bytes), m, v, master (4 each); writes m, v, master and p (2).
	timeIt(b, be, float64(n)*(2+12+12+2)/1e9, "GB/s", func() { be.AdamW(p, g, m, v, master, hp) })
}

func BenchmarkEmbeddingBackward(b *testing.B) {
	be := openGPU(b)
	const n, v, c = 8192, 50304, 4096
	ids := be.Zeros(tensor.Int32, n)
	be.Upload(ids, testutil.RandInts(testutil.Rng(3), v, n))
	dout, dtable := benchRand(b, be, tensor.BFloat16, n, c), be.Zeros(tensor.BFloat16, v, c)
	timeIt(b, be, 3*2*float64(n)*c/1e9, "GB/s", func() { be.EmbeddingBackward(dtable, dout, ids) })
}

// BenchmarkPacked times the consumers of the packed projections on the
// gpt2-124m step's shapes (B·T = 16384 tokens, 12 heads × 64, FFN 2048), in
// bf16: RoPEQKV and its backward (read 3·H·D, write 3·H·D per token), and
// SwiGLUPacked (read 2F, write F per row) and its backward (read 3F, write
// 2F). GB/s counts those bytes once; the (cos, sin) table stays in L2.
//
//	./build/cudabackend.test -test.run '^$' -test.bench Packed -test.benchtime 50x
func BenchmarkPacked(b *testing.B) {
	be := openGPU(b)
	const nb, nt, nh, d = 16, 1024, 12, 64
	const hd, tokens = nh * d, nb * nt
	b.Run(fmt.Sprintf("rope_qkv/tokens=%d,H=%d,D=%d", tokens, nh, d), func(b *testing.B) {
		qkv := benchRand(b, be, tensor.BFloat16, nb, nt, 3*hd)
		q, k, v := be.Zeros(tensor.BFloat16, nb, nt, nh, d), be.Zeros(tensor.BFloat16, nb, nt, nh, d), be.Zeros(tensor.BFloat16, nb, nt, nh, d)
		bytes := 2 * 3 * 2 * float64(tokens*hd)
		b.Run("fwd", func(b *testing.B) {
			timeIt(b, be, bytes/1e9, "GB/s", func() { be.RoPEQKV(q, k, v, qkv, 1e4) })
		})
		b.Run("bwd", func(b *testing.B) {
			timeIt(b, be, bytes/1e9, "GB/s", func() { be.RoPEQKVBackward(qkv, q, k, v, 1e4) })
		})
	})
	const n, f = tokens, 2048
	b.Run(fmt.Sprintf("swiglu/N=%d,F=%d", n, f), func(b *testing.B) {
		gu, out := benchRand(b, be, tensor.BFloat16, n, 2*f), be.Zeros(tensor.BFloat16, n, f)
		b.Run("fwd", func(b *testing.B) {
			timeIt(b, be, 3*2*float64(n*f)/1e9, "GB/s", func() { be.SwiGLUPacked(out, gu) })
		})
		dout, dgu := benchRand(b, be, tensor.BFloat16, n, f), be.Zeros(tensor.BFloat16, n, 2*f)
		b.Run("bwd", func(b *testing.B) {
			timeIt(b, be, 5*2*float64(n*f)/1e9, "GB/s", func() { be.SwiGLUPackedBackward(dgu, dout, gu) })
		})
	})
}
