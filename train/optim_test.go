package train

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
)

// refAdamW is the textbook AdamW step, in float64.
func refAdamW(p, g, m, v []float64, lr, b1, b2, eps, wd, scale float64, step int) {
	for i := range p {
		gi := g[i] * scale
		m[i] = b1*m[i] + (1-b1)*gi
		v[i] = b2*v[i] + (1-b2)*gi*gi
		mh := m[i] / (1 - math.Pow(b1, float64(step)))
		vh := v[i] / (1 - math.Pow(b2, float64(step)))
		p[i] -= lr * (mh/(math.Sqrt(vh)+eps) + wd*p[i])
	}
}

func TestAdamWTwoGroupsAndClipping(t *testing.T) {
	b := newCPU()
	ps := layers.NewParamSet(5)
	// Registration order mixes decayed and not: the set puts decay first.
	for _, a := range []struct {
		name  string
		shape []int
		decay bool
	}{{"norm", []int{6}, false}, {"w1", []int{4, 6}, true}, {"bias", []int{4}, false}, {"w2", []int{6, 4}, true}} {
		if _, err := ps.Add(a.name, a.shape, a.decay, layers.Normal(0.5)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.Materialize(b, tensor.Float64); err != nil {
		t.Fatal(err)
	}
	cfg := AdamWConfig{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	opt, err := NewAdamW(b, ps, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if opt.MomentDType() != tensor.Float64 || opt.Master() != nil {
		t.Fatalf("f64 params: moments %v, master %v; want f64 and none", opt.MomentDType(), opt.Master())
	}
	n, dn := ps.Numel(), ps.DecayNumel()
	p := paramValues(t, ps)
	m, v := make([]float64, n), make([]float64, n)
	rng := testutil.Rng(1)
	_, gFlat := ps.Flat()
	for step := 1; step <= 4; step++ {
		g := testutil.RandFloats(rng, n, 0.1, 3)
		if err := gFlat.SetFloat64s(g); err != nil {
			t.Fatal(err)
		}
		norm, err := opt.GradNorm()
		if err != nil {
			t.Fatal(err)
		}
		var ss float64
		for _, x := range g {
			ss += x * x
		}
		if math.Abs(norm-math.Sqrt(ss)) > 1e-12*norm {
			t.Fatalf("GradNorm %v, want %v", norm, math.Sqrt(ss))
		}
		scale := ClipScale(norm, 1.0)
		if !(scale < 1) || math.Abs(scale-1/(norm+1e-6)) > 1e-15 {
			t.Fatalf("ClipScale(%v, 1) = %v", norm, scale)
		}
		lr := 0.01 * float64(step)
		if err := opt.Step(step, lr, scale); err != nil {
			t.Fatal(err)
		}
		// The reference takes the same float32-rounded hyper-parameters
		// the backend op receives.
		f := func(x float64) float64 { return float64(float32(x)) }
		refAdamW(p[:dn], g[:dn], m[:dn], v[:dn], f(lr), f(0.9), f(0.95), f(1e-8), f(0.1), f(scale), step)
		refAdamW(p[dn:], g[dn:], m[dn:], v[dn:], f(lr), f(0.9), f(0.95), f(1e-8), 0, f(scale), step)
	}
	testutil.AllClose(t, "params", paramValues(t, ps), p, 1e-12)
	mf, vf := opt.Flat()
	testutil.AllClose(t, "m", testutil.Values(t, mf), m, 1e-12)
	testutil.AllClose(t, "v", testutil.Values(t, vf), v, 1e-12)

	// Per-parameter moment views line up with the parameters.
	moms, err := opt.Moments()
	if err != nil {
		t.Fatal(err)
	}
	for i, pp := range ps.Params() {
		if moms[i].Name != pp.Name || !moms[i].M.Shape().Equal(pp.Shape()) {
			t.Fatalf("moment %d: %q %v, param %q %v", i, moms[i].Name, moms[i].M.Shape(), pp.Name, pp.Shape())
		}
		got := testutil.Values(t, moms[i].M)
		testutil.AllClose(t, "m."+pp.Name, got, m[pp.Offset():pp.Offset()+pp.Numel()], 1e-12)
	}
}

func TestClipScale(t *testing.T) {
	for _, tc := range []struct{ norm, clip, want float64 }{
		{0.5, 1, 1}, {0, 1, 1}, {4, 2, 2 / (4 + 1e-6)}, {100, 0, 1},
	} {
		if got := ClipScale(tc.norm, tc.clip); got != tc.want {
			t.Errorf("ClipScale(%v, %v) = %v, want %v", tc.norm, tc.clip, got, tc.want)
		}
	}
}

func TestAdamWErrors(t *testing.T) {
	b := newCPU()
	ps := layers.NewParamSet(1)
	if _, err := ps.Add("w", []int{3}, true, nil); err != nil {
		t.Fatal(err)
	}
	_, err := NewAdamW(b, ps, AdamWConfig{})
	mustContain(t, err, "not materialized")
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	opt, err := NewAdamW(b, ps, AdamWConfig{Beta1: 0.9, Beta2: 0.99, Eps: 1e-8})
	if err != nil {
		t.Fatal(err)
	}
	if opt.MomentDType() != tensor.Float32 {
		t.Errorf("f32 params: moments are %v", opt.MomentDType())
	}
	mustContain(t, opt.Step(0, 1, 1), "step 0")
	mustContain(t, opt.Step(1, 1, math.NaN()), "gradient scale NaN")
}
