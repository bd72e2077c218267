package layers

import (
	"fmt"
	"github.com/asynctp/asynctp/internal/layerkit"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

func TestCapacity(t *testing.T) {
	for _, c := range []struct {
		f          float64
		n, k, e, w int
	}{{0, 10, 2, 4, 0}, {1, 10, 2, 4, 5}, {1.25, 10, 2, 4, 7}, {0.1, 3, 1, 4, 1}} {
		if got := layerkit.Capacity(c.f, c.n, c.k, c.e); got != c.w {
			t.Errorf("layerkit.Capacity(%v, %d, %d, %d) = %d, want %d", c.f, c.n, c.k, c.e, got, c.w)
		}
	}
}

func TestRoutingPlan(t *testing.T) {
	// 4 tokens, top-2 of 3 experts.
	idx := []int32{0, 2, 2, 1, 0, 2, 2, 0}
	p, err := NewRoutingPlan(idx, 4, 2, 3, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	// expert 0: slots 0, 4, 7; expert 1: slot 3; expert 2: slots 1, 2, 5, 6.
	if want := []int32{0, 4, 7, 3, 1, 2, 5, 6}; !slices.Equal(p.Order, want) {
		t.Errorf("Order %v, want %v", p.Order, want)
	}
	if want := []int32{0, 4, 5, 3, 1, 6, 7, 2}; !slices.Equal(p.Pos, want) {
		t.Errorf("Pos %v, want %v", p.Pos, want)
	}
	if want := []int32{0, 2, 3, 1, 0, 1, 2, 3}; !slices.Equal(p.TokenOf(), want) {
		t.Errorf("TokenOf %v, want %v", p.TokenOf(), want)
	}
	// Capacity 2 with one slot of expert 2 already used by earlier tokens:
	// expert 0 keeps slots 0, 4; expert 2 keeps slot 1 only.
	p, err = NewRoutingPlan(idx, 4, 2, 3, 2, []int{0, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{0, 4, 3, 1}; !slices.Equal(p.Order, want) || p.Dropped() != 4 {
		t.Errorf("capacity: Order %v dropped %d, want %v and 4", p.Order, p.Dropped(), want)
	}
	if !slices.Equal(p.Routed, []int{3, 1, 4}) || !slices.Equal(p.Kept, []int{2, 1, 1}) {
		t.Errorf("Routed %v Kept %v", p.Routed, p.Kept)
	}
	for _, c := range []struct {
		idx  []int32
		want string
	}{{[]int32{0, 3}, "expert 3"}, {[]int32{1, 1}, "twice"}, {[]int32{0}, "expected tokens·K"}} {
		if _, err := NewRoutingPlan(c.idx, 1, 2, 3, 0, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRoutingPlan(%v): %v, want an error containing %q", c.idx, err, c.want)
		}
	}
}

// moeCase is a small MoE layer with random weights and inputs in float64
// whose routing has no near-tie (so that finite differences do not change
// the top-k selection).
type moeCase struct {
	b   tensor.Backend
	ps  *ParamSet
	m   *MoE
	x   *tensor.Tensor
	out *tensor.Tensor
}

func newMoECase(t *testing.T, dt tensor.DType, n int, cfg MoEConfig, seed uint64) *moeCase {
	t.Helper()
	b, ps := newBackend(), NewParamSet(seed)
	m, err := NewMoE(b, ps, "moe", cfg)
	noErr(t, b, err)
	noErr(t, b, ps.Materialize(b, dt))
	rng := testutil.Rng(seed)
	randomizeParams(t, ps, rng, 0.5)
	upload(t, b, m.Router.W.W, testutil.RandFloats(rng, m.Router.W.Numel(), 0.3, 1.5))
	x := randDevice(t, b, rng, dt, 1, n, cfg.Dim)
	return &moeCase{b: b, ps: ps, m: m, x: x, out: b.Zeros(dt, n, cfg.Dim)}
}

// minGap is the smallest gap between the K-th and (K+1)-th router
// probability of any token of the last forward (+Inf when K = E).
func minGap(t *testing.T, b tensor.Backend, r *Router) float64 {
	p := download(t, b, r.probs)
	E, gap := r.Experts, math.Inf(1)
	if r.TopK == E {
		return gap
	}
	for n := 0; n < len(p)/E; n++ {
		row := slices.Clone(p[n*E : (n+1)*E])
		sort.Sort(sort.Reverse(sort.Float64Slice(row)))
		gap = min(gap, row[r.TopK-1]-row[r.TopK])
	}
	return gap
}

// moeRef is an independent host oracle of the MoE forward in float64:
// per token, the renormalised top-k of softmax(x·W_rᵀ) (ties to the lower
// expert), then Σ_j w_j·expert_j(x), with slots over capacity (in token
// order) dropped. It returns the output and the loss AuxLoss.
func moeRef(t *testing.T, b tensor.Backend, m *MoE, xs []float64) ([]float64, float64) {
	cfg := m.cfg
	C, F, E, K := cfg.Dim, cfg.Hidden, cfg.Experts, cfg.TopK
	n := len(xs) / C
	wr := download(t, b, m.Router.W.W)
	wg, wu, wd := download(t, b, m.Experts.Gate.W), download(t, b, m.Experts.Up.W), download(t, b, m.Experts.Down.W)
	capacity := layerkit.Capacity(cfg.CapacityFactor, n, K, E)
	out := make([]float64, n*C)
	kept, routed := make([]int, E), make([]int, E)
	probSum := make([]float64, E)
	var zsum float64
	for tok := range n {
		x := xs[tok*C : (tok+1)*C]
		logits := make([]float64, E)
		mx := math.Inf(-1)
		for e := range E {
			logits[e] = testutil.Dot(x, wr[e*C:(e+1)*C])
			mx = max(mx, logits[e])
		}
		var s float64
		for _, l := range logits {
			s += math.Exp(l - mx)
		}
		lse := mx + math.Log(s)
		zsum += lse * lse
		p := make([]float64, E)
		for e := range E {
			p[e] = math.Exp(logits[e] - lse)
			probSum[e] += p[e]
		}
		order := make([]int, E)
		for e := range order {
			order[e] = e
		}
		sort.SliceStable(order, func(i, j int) bool { return p[order[i]] > p[order[j]] })
		var wsum float64
		for _, e := range order[:K] {
			wsum += p[e]
		}
		for _, e := range order[:K] {
			routed[e]++
			if capacity > 0 && kept[e] >= capacity {
				continue
			}
			kept[e]++
			h := make([]float64, F)
			for f := range F {
				g := testutil.Dot(x, wg[(e*F+f)*C:(e*F+f+1)*C])
				u := testutil.Dot(x, wu[(e*F+f)*C:(e*F+f+1)*C])
				h[f] = g / (1 + math.Exp(-g)) * u
			}
			for c := range C {
				out[tok*C+c] += p[e] / wsum * testutil.Dot(h, wd[(e*C+c)*F:(e*C+c+1)*F])
			}
		}
	}
	var bal float64
	for e := range E {
		bal += float64(routed[e]) / float64(n*K) * probSum[e] / float64(n)
	}
	return out, cfg.AuxLossCoef*float64(E)*bal + cfg.ZLossCoef*zsum/float64(n)
}

var moeCases = []struct {
	name string
	n    int
	cfg  MoEConfig
}{
	{"top2", 8, MoEConfig{Dim: 6, Hidden: 5, Experts: 4, TopK: 2, AuxLossCoef: 0.5, ZLossCoef: 0.25}},
	{"top1", 8, MoEConfig{Dim: 6, Hidden: 5, Experts: 4, TopK: 1, AuxLossCoef: 0.5, ZLossCoef: 0.25}},
	{"top3-capacity", 8, MoEConfig{Dim: 6, Hidden: 5, Experts: 5, TopK: 3, CapacityFactor: 0.75, AuxLossCoef: 0.5, ZLossCoef: 0.25}},
	{"no-aux", 8, MoEConfig{Dim: 6, Hidden: 5, Experts: 4, TopK: 2}},
}

// TestMoEForward compares the layer with the host oracle, in float64.
func TestMoEForward(t *testing.T) {
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			c := newMoECase(t, tensor.Float64, tc.n, tc.cfg, 5)
			noErr(t, c.b, c.m.Forward(c.out, c.x))
			want, aux := moeRef(t, c.b, c.m, download(t, c.b, c.x))
			testutil.AllClose(t, "out", download(t, c.b, c.out), want, 1e-12)
			if got := c.m.AuxLoss(); math.Abs(got-aux) > 1e-12*math.Max(1, math.Abs(aux)) {
				t.Errorf("AuxLoss = %v, want %v", got, aux)
			}
			st := c.m.Stats()
			sum := 0
			for _, k := range st.TokensPerExpert {
				sum += k
			}
			if sum != tc.n*tc.cfg.TopK || st.Tokens != tc.n {
				t.Errorf("stats %+v: want %d tokens and %d slots", st, tc.n, tc.n*tc.cfg.TopK)
			}
			if (tc.cfg.CapacityFactor > 0) != (st.Dropped > 0) {
				t.Errorf("stats %+v: dropped %d with capacity factor %v", st, st.Dropped, tc.cfg.CapacityFactor)
			}
			t.Logf("stats %+v", st)
		})
	}
}

// TestGradMoE checks every gradient of the MoE layer, with its auxiliary
// losses, against finite differences of L = Σ out·w + AuxLoss.
func TestGradMoE(t *testing.T) {
	for _, tc := range moeCases {
		t.Run(tc.name, func(t *testing.T) {
			c := newMoECase(t, tensor.Float64, tc.n, tc.cfg, 6)
			b, m := c.b, c.m
			noErr(t, b, m.Forward(c.out, c.x))
			if g := minGap(t, b, m.Router); g < 1e-3 {
				t.Fatalf("near-tie in the routing (gap %.2g): pick another seed", g)
			}
			rng := testutil.Rng(99)
			w := testutil.RandFloats(rng, c.out.Numel(), 0.1, 1)
			loss := func() float64 {
				noErr(t, b, m.Forward(c.out, c.x))
				return testutil.Dot(c.out.F64(), w) + m.AuxLoss()
			}
			_, g := c.ps.Flat()
			g0 := testutil.RandFloats(rng, g.Numel(), 0.1, 1)
			upload(t, b, g, g0)
			dx := b.Zeros(tensor.Float64, c.x.Shape()...)
			b.Fill(dx, 1e3)
			loss()
			dout := b.Zeros(tensor.Float64, c.out.Shape()...)
			upload(t, b, dout, w)
			noErr(t, b, m.Backward(dx, dout))
			gotG := download(t, b, g)
			for i := range gotG {
				gotG[i] -= g0[i]
			}
			logErr(t, "dx", download(t, b, dx), testutil.NumGrad(loss, c.x.F64(), fdStep))
			for _, p := range c.ps.Params() {
				want := testutil.NumGrad(loss, p.W.F64(), fdStep)
				logErr(t, "d"+p.Name, gotG[p.Offset():p.Offset()+p.Numel()], want)
			}
		})
	}
}

// TestMoEOneExpertIsMLP: with one expert and top-1 the weight is 1 and the
// layer is the expert's MLP; the router gets no gradient from the output.
func TestMoEOneExpertIsMLP(t *testing.T) {
	cfg := MoEConfig{Dim: 6, Hidden: 5, Experts: 1, TopK: 1, Std: 0.3, OutStd: 0.3}
	c := newMoECase(t, tensor.Float64, 7, cfg, 8)
	b := c.b
	ps := NewParamSet(1)
	mlp, err := NewMLP(b, ps, "mlp", MLPConfig{Dim: 6, Hidden: 5, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	noErr(t, b, ps.Materialize(b, tensor.Float64))
	for i, p := range c.m.Experts.Params() {
		b.Copy(mlp.Params()[i].W, layerkit.Reshape(p.W, mlp.Params()[i].W.Shape()...))
	}
	want := b.Zeros(tensor.Float64, 7, 6)
	noErr(t, b, mlp.Forward(want, c.x))
	noErr(t, b, c.m.Forward(c.out, c.x))
	testutil.AllClose(t, "out", download(t, b, c.out), download(t, b, want), 1e-14)
	dout := randDevice(t, b, testutil.Rng(1), tensor.Float64, 1, 7, 6)
	dx, dxm := b.Zeros(tensor.Float64, 7, 6), b.Zeros(tensor.Float64, 7, 6)
	noErr(t, b, c.m.Backward(dx, dout))
	noErr(t, b, mlp.Backward(dxm, dout))
	testutil.AllClose(t, "dx", download(t, b, dx), download(t, b, dxm), 1e-13)
	if s := b.SumSquares(c.m.Router.W.G); s != 0 {
		t.Errorf("router gradient Σ² = %v, want 0", s)
	}
}

func TestMoEErrors(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	for _, c := range []struct {
		cfg  MoEConfig
		want string
	}{
		{MoEConfig{Dim: 4, Hidden: 4, Experts: 2, TopK: 3}, "TopK = 3"},
		{MoEConfig{Dim: 4, Hidden: 4, Experts: 0, TopK: 1}, "Experts = 0"},
		{MoEConfig{Dim: 4, Hidden: 4, Experts: 2, TopK: 1, CapacityFactor: -1}, "CapacityFactor = -1"},
		{MoEConfig{Dim: 4, Hidden: 4, Experts: 2, TopK: 1, ZLossCoef: math.NaN()}, "ZLossCoef = NaN"},
	} {
		if _, err := NewMoE(b, ps, "moe", c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewMoE(%+v): %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	var plain tensor.Backend = struct{ tensor.Backend }{newBackend()}
	if _, err := NewMoE(plain, NewParamSet(1), "moe", MoEConfig{Dim: 4, Hidden: 4, Experts: 2, TopK: 1}); err == nil || !strings.Contains(err.Error(), "MoEOps") {
		t.Errorf("NewMoE on a backend without MoE ops: %v", err)
	}
	m, err := NewMoE(b, ps, "moe", MoEConfig{Dim: 4, Hidden: 4, Experts: 2, TopK: 1})
	noErr(t, b, err)
	x := b.Zeros(tensor.Float32, 3, 4)
	if err := m.Forward(b.Zeros(tensor.Float32, 3, 4), x); err == nil || !strings.Contains(err.Error(), "not materialized") {
		t.Errorf("Forward before Materialize: %v", err)
	}
	noErr(t, b, ps.Materialize(b, tensor.Float32))
	if err := m.Backward(x, x); err == nil || !strings.Contains(err.Error(), "without a successful Forward") {
		t.Errorf("Backward before Forward: %v", err)
	}
	if err := m.Forward(b.Zeros(tensor.Float32, 3, 5), x); err == nil || !strings.Contains(err.Error(), "output") {
		t.Errorf("Forward with a bad output: %v", err)
	}
}

// TestExpertsGroupedMatchesLoop: the experts' grouped GEMMs (the backend's
// GroupedGEMM) and the per-expert MatMul loop (a backend without it) give
// the same outputs and gradients, on uneven counts with empty experts.
func TestExpertsGroupedMatchesLoop(t *testing.T) {
	counts := []int{3, 0, 7, 1, 0}
	m := 11
	cfg := ExpertsConfig{Dim: 6, Hidden: 10, Experts: 7, First: 1, Count: 5, Std: 0.5, OutStd: 0.5}
	type run struct{ out, dx []float64 }
	var results [2]run
	var grads [2][][]float64
	for i, wrap := range []bool{false, true} {
		b := newBackend()
		if wrap {
			b = struct{ tensor.Backend }{b} // hides tensor.GroupedGEMM
		}
		ps := NewParamSet(3)
		ex, err := NewExperts(b, ps, "moe", cfg)
		noErr(t, b, err)
		if _, ok := b.(tensor.GroupedGEMM); ok == wrap || (ex.grouped != nil) == wrap {
			t.Fatalf("wrap %v: the backend's GroupedGEMM is %v, the layer's %v", wrap, ok, ex.grouped != nil)
		}
		noErr(t, b, ps.Materialize(b, tensor.Float64))
		rng := testutil.Rng(9)
		x := randDevice(t, b, rng, tensor.Float64, 1, m, cfg.Dim)
		dout := randDevice(t, b, rng, tensor.Float64, 1, m, cfg.Dim)
		out, dx := b.Zeros(tensor.Float64, m, cfg.Dim), b.Zeros(tensor.Float64, m, cfg.Dim)
		b.Fill(out, math.NaN())
		b.Fill(dx, math.NaN())
		noErr(t, b, ex.Forward(out, x, counts))
		noErr(t, b, ex.Backward(dx, dout))
		results[i] = run{download(t, b, out), download(t, b, dx)}
		for _, p := range ex.Params() {
			grads[i] = append(grads[i], download(t, b, p.G))
		}
	}
	check := func(what string, got, want []float64) {
		t.Helper()
		if e := testutil.RelErr(got, want); !(e <= 1e-12) {
			t.Errorf("%s: grouped vs loop relative error %g", what, e)
		}
	}
	check("out", results[0].out, results[1].out)
	check("dx", results[0].dx, results[1].dx)
	for j := range grads[0] {
		check(fmt.Sprintf("gradient %d", j), grads[0][j], grads[1][j])
	}
}
