package optim

import (
	"github.com/asynctp/asynctp/tensor/cpu"
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
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
	opt, err := NewAdamWWithConfig(b, ps, cfg)
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
	_, err := NewAdamW(b, ps)
	testutil.ErrorContains(t, err, "not materialized")
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	opt, err := NewAdamWWithConfig(b, ps, AdamWConfig{Beta1: 0.9, Beta2: 0.99, Eps: 1e-8})
	if err != nil {
		t.Fatal(err)
	}
	if opt.MomentDType() != tensor.Float32 {
		t.Errorf("f32 params: moments are %v", opt.MomentDType())
	}
	testutil.ErrorContains(t, opt.Step(0, 1, 1), "step 0")
	testutil.ErrorContains(t, opt.Step(1, 1, math.NaN()), "gradient scale NaN")
}

func newCPU() tensor.Backend { return cpu.New() }

// paramValues is the values of ps's parameters, flat.
func paramValues(t testing.TB, ps *layers.ParamSet) []float64 {
	t.Helper()
	w, _ := ps.Flat()
	return testutil.Values(t, w)
}

// materialized is a small set of two parameters (one decayed), f32.
func materialized(t *testing.T, b tensor.Backend) *layers.ParamSet {
	t.Helper()
	ps := layers.NewParamSet(3)
	if _, err := ps.Add("w", []int{3, 4}, true, layers.Normal(0.5)); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Add("b", []int{3}, false, layers.Normal(0.5)); err != nil {
		t.Fatal(err)
	}
	if err := ps.Materialize(b, tensor.Float32); err != nil {
		t.Fatal(err)
	}
	return ps
}

// TestAdamWConfigRefused: every config that would make NaN weights (a
// beta whose complement is 0 or that is out of range, a zero or NaN Eps,
// a NaN or negative weight decay) is refused by the constructor with an
// error naming the field; the zero config among them.
func TestAdamWConfigRefused(t *testing.T) {
	b := newCPU()
	ps := materialized(t, b)
	def := DefaultAdamWConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("the default config is refused: %v", err)
	}
	nan := math.NaN()
	with := func(f func(*AdamWConfig)) AdamWConfig { c := def; f(&c); return c }
	for _, tc := range []struct {
		name  string
		cfg   AdamWConfig
		field string
	}{
		{"zero value", AdamWConfig{}, "AdamWConfig.Eps = 0"},
		{"beta1 1", with(func(c *AdamWConfig) { c.Beta1 = 1 }), "AdamWConfig.Beta1 = 1"},
		{"beta1 negative", with(func(c *AdamWConfig) { c.Beta1 = -0.1 }), "AdamWConfig.Beta1 = -0.1"},
		{"beta1 NaN", with(func(c *AdamWConfig) { c.Beta1 = nan }), "AdamWConfig.Beta1 = NaN"},
		{"beta2 1", with(func(c *AdamWConfig) { c.Beta2 = 1 }), "AdamWConfig.Beta2 = 1"},
		{"beta2 above 1", with(func(c *AdamWConfig) { c.Beta2 = 1.5 }), "AdamWConfig.Beta2 = 1.5"},
		{"eps 0", with(func(c *AdamWConfig) { c.Eps = 0 }), "AdamWConfig.Eps = 0"},
		{"eps NaN", with(func(c *AdamWConfig) { c.Eps = nan }), "AdamWConfig.Eps = NaN"},
		{"eps Inf", with(func(c *AdamWConfig) { c.Eps = math.Inf(1) }), "AdamWConfig.Eps = +Inf"},
		{"weight decay NaN", with(func(c *AdamWConfig) { c.WeightDecay = nan }), "AdamWConfig.WeightDecay = NaN"},
		{"weight decay negative", with(func(c *AdamWConfig) { c.WeightDecay = -1 }), "AdamWConfig.WeightDecay = -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewAdamWWithConfig(b, ps, tc.cfg)
			testutil.ErrorContains(t, err, tc.field)
		})
	}
	// Beta1 = 0 (no momentum) and WeightDecay = 0 are real settings.
	if _, err := NewAdamWWithConfig(b, ps, with(func(c *AdamWConfig) { c.Beta1, c.WeightDecay = 0, 0 })); err != nil {
		t.Errorf("Beta1 = 0, WeightDecay = 0 refused: %v", err)
	}
}

// TestAdamWStepRefusesBadLR: a NaN, infinite or negative learning rate (or
// clipping threshold) is an error, and the weights and moments stay as
// they were; then a good step with the default config moves every weight
// to a finite value, as the float64 reference does.
func TestAdamWStepRefusesBadLR(t *testing.T) {
	b := newCPU()
	ps := materialized(t, b)
	opt, err := NewAdamW(b, ps)
	if err != nil {
		t.Fatal(err)
	}
	_, g := ps.Flat()
	grad := testutil.RandFloats(testutil.Rng(2), ps.Numel(), 0.1, 1)
	if err := g.SetFloat64s(grad); err != nil {
		t.Fatal(err)
	}
	before := paramValues(t, ps)
	normSq := b.Zeros(tensor.Float32, 1)
	for _, lr := range []float64{math.NaN(), math.Inf(1), -1e-3} {
		testutil.ErrorContains(t, opt.Step(1, lr, 1), "learning rate")
		testutil.ErrorContains(t, opt.StepClipped(1, lr, normSq, 1), "learning rate")
		_, err := opt.ClipStep(1, lr, 1, nil)
		testutil.ErrorContains(t, err, "learning rate")
	}
	for _, clip := range []float64{math.NaN(), -1, math.Inf(1)} {
		testutil.ErrorContains(t, opt.StepClipped(1, 1e-3, normSq, clip), "clipping threshold")
		_, err := opt.ClipStep(1, 1e-3, clip, nil)
		testutil.ErrorContains(t, err, "clipping threshold")
	}
	testutil.AllClose(t, "weights after refused steps", paramValues(t, ps), before, 0)
	m, v := opt.Flat()
	for _, x := range append(testutil.Values(t, m), testutil.Values(t, v)...) {
		if x != 0 {
			t.Fatalf("moments changed by a refused step: %v", x)
		}
	}
	read, err := opt.ClipStep(1, 1e-3, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := read.Wait()
	if err != nil {
		t.Fatal(err)
	}
	var want float64
	for _, x := range grad {
		want += float64(float32(x)) * float64(float32(x))
	}
	if math.Abs(ss[0]-want) > 1e-5*want {
		t.Errorf("ClipStep's Σ g² = %v, want %v", ss[0], want)
	}
	ref := append([]float64(nil), before...)
	c := DefaultAdamWConfig()
	f := func(x float64) float64 { return float64(float32(x)) }
	zero := func() []float64 { return make([]float64, ps.Numel()) }
	dn := ps.DecayNumel()
	g32 := make([]float64, len(grad))
	for i, x := range grad {
		g32[i] = f(x)
	}
	refAdamW(ref[:dn], g32[:dn], zero(), zero(), f(1e-3), f(c.Beta1), f(c.Beta2), f(c.Eps), f(c.WeightDecay), 1, 1)
	refAdamW(ref[dn:], g32[dn:], zero(), zero(), f(1e-3), f(c.Beta1), f(c.Beta2), f(c.Eps), 0, 1, 1)
	testutil.AllClose(t, "weights after a default step", paramValues(t, ps), ref, 1e-6)
}
