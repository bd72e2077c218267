package cpu_test

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Forward checks against plain float64 loops written here, independently of
// the backend's kernels.

func TestMatMulNaive(t *testing.T) {
	rng := testutil.Rng(20)
	b := cpu.New()
	const batch, m, n, k = 2, 5, 7, 3
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			tA, tB := tr[0], tr[1]
			sa, sb := []int{batch, m, k}, []int{batch, k, n}
			if tA {
				sa = []int{batch, k, m}
			}
			if tB {
				sb = []int{batch, n, k}
			}
			a, bm := testutil.Rand(rng, dt, sa...), testutil.Rand(rng, dt, sb...)
			av, bv := testutil.Values(t, a), testutil.Values(t, bm)
			for _, beta := range []float32{0, 0.5} {
				c := testutil.Rand(rng, dt, batch, m, n)
				c0 := testutil.Values(t, c)
				if beta == 0 {
					b.Fill(c, math.NaN()) // must be ignored
				}
				b.MatMul(c, a, bm, tA, tB, 1.5, beta)
				want := make([]float64, batch*m*n)
				for p := range batch {
					for i := range m {
						for j := range n {
							var s float64
							for l := range k {
								ai := p*m*k + i*k + l
								if tA {
									ai = p*m*k + l*m + i
								}
								bi := p*k*n + l*n + j
								if tB {
									bi = p*k*n + j*k + l
								}
								s += av[ai] * bv[bi]
							}
							o := p*m*n + i*n + j
							want[o] = 1.5 * s
							if beta != 0 {
								want[o] += float64(beta) * c0[o]
							}
						}
					}
				}
				noErr(t, b)
				testutil.AllClose(t, "MatMul "+dt.String(), testutil.Values(t, c), want, 1e-6)
			}
		}
	}
}

func TestAttentionNaive(t *testing.T) {
	rng := testutil.Rng(21)
	b := cpu.New()
	const nb, nt, nh, d, scale = 2, 5, 2, 4, 0.5
	q, k, v := rnd(rng, nb, nt, nh, d), rnd(rng, nb, nt, nh, d), rnd(rng, nb, nt, nh, d)
	out, lse := zeros(nb, nt, nh, d), tensor.MustHost(tensor.Float32, nb, nh, nt)
	b.Attention(out, lse, q, k, v, scale)
	noErr(t, b)
	at := func(x *tensor.Tensor, bi, ti, hi, di int) float64 { return x.F64()[((bi*nt+ti)*nh+hi)*d+di] }
	wantOut, wantLSE := make([]float64, out.Numel()), make([]float64, lse.Numel())
	for bi := range nb {
		for hi := range nh {
			for i := range nt {
				s := make([]float64, i+1)
				for j := range s {
					for x := range d {
						s[j] += at(q, bi, i, hi, x) * at(k, bi, j, hi, x)
					}
					s[j] *= scale
				}
				var z float64
				for _, sj := range s {
					z += math.Exp(sj)
				}
				wantLSE[(bi*nh+hi)*nt+i] = math.Log(z)
				for x := range d {
					var o float64
					for j, sj := range s {
						o += math.Exp(sj) / z * at(v, bi, j, hi, x)
					}
					wantOut[((bi*nt+i)*nh+hi)*d+x] = o
				}
			}
		}
	}
	testutil.AllClose(t, "Attention out", out.F64(), wantOut, 1e-12)
	testutil.AllClose(t, "Attention lse (f32)", testutil.Values(t, lse), wantLSE, 1e-7)
}

func TestRowOpsNaive(t *testing.T) {
	rng := testutil.Rng(22)
	b := cpu.New()
	const n, c = 3, 5
	x, w := rnd(rng, n, c), rnd(rng, c)
	xv, wv := x.F64(), w.F64()

	out, rstd := zeros(n, c), tensor.MustHost(tensor.Float32, n)
	b.RMSNorm(out, rstd, x, w, 1e-5)
	sm := zeros(n, c)
	b.Softmax(sm, x)
	noErr(t, b)
	wantNorm, wantRstd, wantSm := make([]float64, n*c), make([]float64, n), make([]float64, n*c)
	for r := range n {
		var ss, z float64
		for j := range c {
			ss += xv[r*c+j] * xv[r*c+j]
			z += math.Exp(xv[r*c+j])
		}
		wantRstd[r] = 1 / math.Sqrt(ss/c+float64(float32(1e-5))) // eps is a float32
		for j := range c {
			wantNorm[r*c+j] = xv[r*c+j] * wantRstd[r] * wv[j]
			wantSm[r*c+j] = math.Exp(xv[r*c+j]) / z
		}
	}
	testutil.AllClose(t, "RMSNorm", out.F64(), wantNorm, 1e-14)
	testutil.AllClose(t, "RMSNorm rstd (f32)", testutil.Values(t, rstd), wantRstd, 1e-7)
	testutil.AllClose(t, "Softmax", sm.F64(), wantSm, 1e-14)

	// Cross-entropy on large logits: the naive formula needs the shift too.
	logits := rnd(rng, n, c)
	shift := zeros(c)
	b.Fill(shift, 800)
	b.AddBias(logits, shift)
	targets, _ := tensor.FromInt32([]int32{4, -3, 0}, n)
	losses := tensor.MustHost(tensor.Float32, n)
	b.CrossEntropy(losses, nil, logits, targets, 1)
	noErr(t, b)
	lv := logits.F64()
	want := make([]float64, n)
	for r, tg := range targets.I32() {
		if tg < 0 {
			continue
		}
		var z float64
		for j := range c {
			z += math.Exp(lv[r*c+j] - 800)
		}
		want[r] = math.Log(z) - (lv[r*c+int(tg)] - 800)
	}
	testutil.AllClose(t, "CrossEntropy losses", testutil.Values(t, losses), want, 1e-6)
}

func TestActivationValues(t *testing.T) {
	b := cpu.New()
	xs := []float64{-3, -1, -0.5, 0, 0.5, 1, 3}
	x, _ := tensor.FromFloat64(xs, len(xs))
	gelu, silu := zeros(len(xs)), zeros(len(xs))
	b.GELU(gelu, x)
	ones := zeros(len(xs))
	b.Fill(ones, 1)
	b.SwiGLU(silu, x, ones)
	noErr(t, b)
	for i, v := range xs {
		g := 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
		s := v / (1 + math.Exp(-v))
		if math.Abs(gelu.F64()[i]-g) > 1e-15 || math.Abs(silu.F64()[i]-s) > 1e-15 {
			t.Errorf("x = %v: gelu %v silu %v, want %v %v", v, gelu.F64()[i], silu.F64()[i], g, s)
		}
	}
}

func TestRoPENaive(t *testing.T) {
	rng := testutil.Rng(23)
	b := cpu.New()
	const nb, nt, nh, d, theta = 1, 4, 2, 6, 10000.0
	x := rnd(rng, nb, nt, nh, d)
	out := zeros(nb, nt, nh, d)
	b.RoPE(out, x, theta)
	back := zeros(nb, nt, nh, d)
	b.RoPEBackward(back, out, theta) // the inverse rotation
	noErr(t, b)
	want := make([]float64, x.Numel())
	for tt := range nt {
		for h := range nh {
			o := (tt*nh + h) * d
			for i := range d / 2 {
				a := float64(tt) / math.Pow(theta, float64(2*i)/d)
				x1, x2 := x.F64()[o+i], x.F64()[o+i+d/2]
				want[o+i] = x1*math.Cos(a) - x2*math.Sin(a)
				want[o+i+d/2] = x1*math.Sin(a) + x2*math.Cos(a)
			}
		}
	}
	testutil.AllClose(t, "RoPE", out.F64(), want, 1e-14)
	testutil.AllClose(t, "RoPEBackward∘RoPE", back.F64(), x.F64(), 1e-14)
}

// adamRef is one AdamW step on one scalar, in float64.
func adamRef(p, g, m, v float64, hp tensor.AdamW) (float64, float64, float64) {
	b1, b2 := float64(hp.Beta1), float64(hp.Beta2)
	gs := float64(hp.GradScale)
	if gs == 0 {
		gs = 1
	}
	g *= gs
	m = b1*m + (1-b1)*g
	v = b2*v + (1-b2)*g*g
	mhat := m / (1 - math.Pow(b1, float64(hp.Step)))
	vhat := v / (1 - math.Pow(b2, float64(hp.Step)))
	p -= float64(hp.LR) * (mhat/(math.Sqrt(vhat)+float64(hp.Eps)) + float64(hp.WeightDecay)*p)
	return p, m, v
}

func TestAdamWScalar(t *testing.T) {
	rng := testutil.Rng(24)
	const n = 40000 // more than one work chunk
	hp := tensor.AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradScale: 0.5}
	type state struct{ p, m, v []float64 }
	for _, tc := range []struct {
		name     string
		dt       tensor.DType // of p and g
		master   bool
		tol, tmv float64 // for p, and for m and v
	}{
		{"f64", tensor.Float64, false, 1e-14, 1e-14},
		{"f32", tensor.Float32, false, 1e-6, 1e-6},
		{"bf16 with f32 master", tensor.BFloat16, true, 1e-2, 1e-6},
		{"f32 with f32 master", tensor.Float32, true, 1e-6, 1e-6},
	} {
		b := cpu.New()
		cd := tc.dt
		if tc.master {
			cd = tensor.Float32
		}
		w0 := testutil.Rand(rng, cd, n)
		p := tensor.MustHost(tc.dt, n)
		b.Copy(p, w0)
		var master *tensor.Tensor
		if tc.master {
			master = clone(w0)
		}
		m, v := tensor.MustHost(cd, n), tensor.MustHost(cd, n)
		ref := state{testutil.Values(t, w0), make([]float64, n), make([]float64, n)}
		for step := 1; step <= 3; step++ {
			hp.Step = step
			g := testutil.Rand(rng, tc.dt, n)
			b.AdamW(p, g, m, v, master, hp)
			for i, gi := range testutil.Values(t, g) {
				ref.p[i], ref.m[i], ref.v[i] = adamRef(ref.p[i], gi, ref.m[i], ref.v[i], hp)
			}
		}
		noErr(t, b)
		testutil.AllClose(t, tc.name+" p", testutil.Values(t, p), ref.p, tc.tol)
		testutil.AllClose(t, tc.name+" m", testutil.Values(t, m), ref.m, tc.tmv)
		testutil.AllClose(t, tc.name+" v", testutil.Values(t, v), ref.v, tc.tmv)
		if tc.master {
			testutil.AllClose(t, tc.name+" master", testutil.Values(t, master), ref.p, 1e-6)
			pv := testutil.Values(t, p)
			for i, x := range master.F32() { // p is master rounded to p's dtype
				if want := roundTo(tc.dt, x); pv[i] != want {
					t.Fatalf("%s: p[%d] = %v, want master %v rounded to %v", tc.name, i, pv[i], want, tc.dt)
				}
			}
		}
	}
}

func roundTo(dt tensor.DType, x float32) float64 {
	if dt == tensor.BFloat16 {
		return float64(tensor.RoundBF16(x))
	}
	return float64(x)
}

func TestSumSquares(t *testing.T) {
	rng := testutil.Rng(25)
	b := cpu.New()
	x := testutil.Rand(rng, tensor.Float32, 70001)
	var want float64
	for _, v := range x.F32() {
		want += float64(v) * float64(v)
	}
	if got := b.SumSquares(x); math.Abs(got-want) > 1e-12*want {
		t.Errorf("SumSquares = %v, want %v", got, want)
	}
	ints, _ := tensor.FromFloat64([]float64{1, -2, 3}, 3)
	if got := b.SumSquares(ints); got != 14 {
		t.Errorf("SumSquares(1, -2, 3) = %v, want 14", got)
	}
	noErr(t, b)
}

// TestBF16Rounding converts specific float32 values to bfloat16 with Copy,
// against bit patterns worked out by hand.
func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		in   uint32 // float32 bits
		want uint16 // bfloat16 bits
		what string
	}{
		{0x3f800000, 0x3f80, "1 exactly"},
		{0x3f808000, 0x3f80, "tie, lower neighbour even: down"},
		{0x3f818000, 0x3f82, "tie, upper neighbour even: up"},
		{0x3f808001, 0x3f81, "just above a tie: up"},
		{0x3f807fff, 0x3f80, "just below a tie: down"},
		{0xbf818000, 0xbf82, "negative tie: away to even"},
		{0x7f7f7fff, 0x7f7f, "largest finite bf16"},
		{0x7f7f8000, 0x7f80, "tie above the largest finite: overflows to +Inf"},
		{0x7f7fffff, 0x7f80, "largest float32 overflows to +Inf"},
		{0xff7fffff, 0xff80, "overflows to −Inf"},
		{0x7f800000, 0x7f80, "+Inf"},
		{0xff800000, 0xff80, "−Inf"},
		{0x80000000, 0x8000, "−0"},
		{0x00008000, 0x0000, "tiny subnormal tie: to even 0"},
		{0x00018000, 0x0002, "subnormal tie: up to even"},
	}
	b := cpu.New()
	src := tensor.MustHost(tensor.Float32, len(cases))
	for i, c := range cases {
		src.F32()[i] = math.Float32frombits(c.in)
	}
	dst := tensor.MustHost(tensor.BFloat16, len(cases))
	b.Copy(dst, src)
	for i, c := range cases {
		if got := dst.BF16()[i]; got != c.want {
			t.Errorf("%s: %#08x → %#04x, want %#04x", c.what, c.in, got, c.want)
		}
	}
	// From float64 too, and back to float32 exactly.
	f64 := tensor.MustHost(tensor.Float64, len(cases))
	b.Copy(f64, src)
	dst2 := tensor.MustHost(tensor.BFloat16, len(cases))
	b.Copy(dst2, f64)
	back := tensor.MustHost(tensor.Float32, len(cases))
	b.Copy(back, dst2)
	for i, c := range cases {
		if got := math.Float32bits(back.F32()[i]); got != uint32(c.want)<<16 {
			t.Errorf("%s via f64 and back: %#08x, want %#08x", c.what, got, uint32(c.want)<<16)
		}
	}

	// NaN stays NaN (quiet), whatever its payload.
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0xffffffff, 0x7f80ffff} {
		src1, _ := tensor.FromFloat32([]float32{math.Float32frombits(bits)}, 1)
		d := tensor.MustHost(tensor.BFloat16, 1)
		b.Copy(d, src1)
		if h := d.BF16()[0]; h&0x7f80 != 0x7f80 || h&0x7f == 0 {
			t.Errorf("NaN %#08x → %#04x, not a NaN", bits, h)
		}
	}
	noErr(t, b)
}

// TestZeroSizes runs ops on empty tensors and a zero inner dimension.
func TestZeroSizes(t *testing.T) {
	b := cpu.New()
	c := zeros(3, 4)
	b.Fill(c, math.NaN())
	b.MatMul(c, zeros(3, 0), zeros(0, 4), false, false, 1, 0) // k = 0: C = 0
	for _, v := range c.F64() {
		if v != 0 {
			t.Fatalf("MatMul with k = 0 left %v, want 0", v)
		}
	}
	b.MatMul(zeros(0, 4), zeros(0, 5), zeros(5, 4), false, false, 1, 0)
	b.RMSNorm(zeros(0, 8), zeros(0), zeros(0, 8), zeros(8), 1e-5)
	b.Softmax(zeros(2, 0), zeros(2, 0))
	b.Attention(zeros(1, 0, 2, 4), zeros(1, 2, 0), zeros(1, 0, 2, 4), zeros(1, 0, 2, 4), zeros(1, 0, 2, 4), 1)
	b.CrossEntropy(zeros(0), nil, zeros(0, 5), tensor.MustHost(tensor.Int32, 0), 1)
	if got := b.SumSquares(zeros(0)); got != 0 {
		t.Errorf("SumSquares of nothing = %v", got)
	}
	noErr(t, b)
}
