package layers

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

func TestParamSetLayout(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	add := func(name string, decay bool, shape ...int) *Param {
		p, err := ps.Add(name, shape, decay, Normal(1))
		noErr(t, b, err)
		return p
	}
	n1 := add("norm", false, 3)
	w1 := add("w1", true, 2, 3)
	bias := add("bias", false, 4)
	w2 := add("w2", true, 5)
	if ps.Numel() != 3+6+4+5 || ps.DecayNumel() != 11 {
		t.Fatalf("Numel %d DecayNumel %d, want 18 11", ps.Numel(), ps.DecayNumel())
	}
	noErr(t, b, ps.Materialize(b, tensor.Float32))
	want := []*Param{w1, w2, n1, bias}
	got := ps.Params()
	off := 0
	for i, p := range got {
		if p != want[i] {
			t.Fatalf("Params()[%d] = %q, want %q", i, p.Name, want[i].Name)
		}
		if p.Offset() != off || p.W.Offset() != off || p.G.Offset() != off {
			t.Errorf("%s at offset %d (W %d, G %d), want %d", p.Name, p.Offset(), p.W.Offset(), p.G.Offset(), off)
		}
		if !p.W.Shape().Equal(p.Shape()) || !p.G.Shape().Equal(p.Shape()) {
			t.Errorf("%s: W %v G %v, want shape %v", p.Name, p.W, p.G, p.Shape())
		}
		off += p.Numel()
	}
	w, g := ps.Flat()
	if w.Numel() != 18 || g.Numel() != 18 || w1.W.Buffer() != w.Buffer() || w1.G.Buffer() != g.Buffer() {
		t.Fatalf("flat buffers %v %v not shared by the views", w, g)
	}
	// Writing through the flat buffer shows in the views.
	b.Fill(g, 2)
	if v := download(t, b, bias.G); v[3] != 2 {
		t.Fatalf("bias.G after Fill of the flat gradient: %v", v)
	}
	ps.ZeroGrad()
	if s := b.SumSquares(g); s != 0 {
		t.Fatalf("ZeroGrad left Σg² = %v", s)
	}
	if ps.Lookup("w2") != w2 || ps.Lookup("nope") != nil {
		t.Fatal("Lookup")
	}
}

// TestParamInitIndependent: a parameter's initial values depend on the seed
// and its name only, not on the order of registration or on the dtype.
func TestParamInitIndependent(t *testing.T) {
	b := newBackend()
	build := func(seed uint64, names []string, dt tensor.DType) map[string][]float64 {
		ps := NewParamSet(seed)
		for _, n := range names {
			if _, err := ps.Add(n, []int{4, 8}, true, Normal(0.5)); err != nil {
				t.Fatal(err)
			}
		}
		noErr(t, b, ps.Materialize(b, dt))
		out := map[string][]float64{}
		for _, n := range names {
			out[n] = download(t, b, ps.Lookup(n).W)
		}
		return out
	}
	a := build(3, []string{"x", "y", "z"}, tensor.Float64)
	c := build(3, []string{"z", "x", "y"}, tensor.Float64)
	f := build(3, []string{"y", "z", "x"}, tensor.Float32)
	d := build(4, []string{"x", "y", "z"}, tensor.Float64)
	for _, n := range []string{"x", "y", "z"} {
		for i := range a[n] {
			if a[n][i] != c[n][i] {
				t.Fatalf("%s[%d]: %v then %v after reordering", n, i, a[n][i], c[n][i])
			}
			if float64(float32(a[n][i])) != f[n][i] {
				t.Fatalf("%s[%d]: f64 %v, f32 %v", n, i, a[n][i], f[n][i])
			}
		}
		if a[n][0] == d[n][0] {
			t.Errorf("%s: seeds 3 and 4 give the same first value", n)
		}
	}
	if a["x"][0] == a["y"][0] {
		t.Error("x and y start alike")
	}
}

func stdOf(v []float64) float64 {
	var s, s2 float64
	for _, x := range v {
		s += x
		s2 += x * x
	}
	n := float64(len(v))
	return math.Sqrt(s2/n - (s/n)*(s/n))
}

// TestGPTInit checks the GPT-2 style initialisation: N(0, InitStd²), the
// residual outputs scaled by 1/sqrt(2·Layers), norm weights 1.
func TestGPTInit(t *testing.T) {
	b := newBackend()
	cfg := GPTConfig{Layers: 4, Dim: 64, Heads: 4, Vocab: 64, Seq: 8, InitStd: 0.05}
	m, err := NewGPT(b, cfg, tensor.Float32)
	noErr(t, b, err)
	for _, p := range m.Params().Params() {
		v := download(t, b, p.W)
		want := 0.05
		switch {
		case strings.HasSuffix(p.Name, "norm.weight"):
			for _, x := range v {
				if x != 1 {
					t.Fatalf("%s has %v, want 1", p.Name, x)
				}
			}
			if p.Decay {
				t.Errorf("%s has weight decay", p.Name)
			}
			continue
		case strings.HasSuffix(p.Name, ".wo.weight"), strings.HasSuffix(p.Name, ".w_down.weight"):
			want /= math.Sqrt(8)
		}
		if !p.Decay {
			t.Errorf("%s has no weight decay", p.Name)
		}
		if s := stdOf(v); math.Abs(s-want) > 0.1*want {
			t.Errorf("%s: std %.4f, want %.4f", p.Name, s, want)
		}
	}
}

func TestParamSetErrors(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	if _, err := ps.Add("a", []int{2, 3}, true, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		shape []int
		want  string
	}{
		{"a", []int{2}, "registered twice"},
		{"", []int{2}, "empty name"},
		{"b", nil, "no dimensions"},
		{"c", []int{2, 0}, "expected positive dimensions"},
	} {
		if _, err := ps.Add(c.name, c.shape, true, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Add(%q, %v): error %v, want one containing %q", c.name, c.shape, err, c.want)
		}
	}
	if err := NewParamSet(1).Materialize(b, tensor.Float32); err == nil {
		t.Error("Materialize of an empty set succeeded")
	}
	if err := ps.Materialize(b, tensor.Int32); err == nil || !strings.Contains(err.Error(), "float dtype") {
		t.Errorf("Materialize(i32): %v", err)
	}
	if err := ps.Materialize(nil, tensor.Float32); err == nil {
		t.Error("Materialize(nil backend) succeeded")
	}
	noErr(t, b, ps.Materialize(b, tensor.Float32))
	if err := ps.Materialize(b, tensor.Float32); err == nil {
		t.Error("second Materialize succeeded")
	}
	if _, err := ps.Add("d", []int{1}, false, nil); err == nil || !strings.Contains(err.Error(), "already materialized") {
		t.Errorf("Add after Materialize: %v", err)
	}
	if v := download(t, b, ps.Lookup("a").W); v[0] != 0 || v[5] != 0 {
		t.Errorf("nil init gave %v, want zeros", v)
	}
}

// TestShardInit: a shard registered under the full parameter's name gets
// the slice of the full parameter's initial values.
func TestShardInit(t *testing.T) {
	b := newBackend()
	full := NewParamSet(9)
	if _, err := full.Add("w", []int{4, 6}, true, Normal(1)); err != nil {
		t.Fatal(err)
	}
	noErr(t, b, full.Materialize(b, tensor.Float64))
	all := download(t, b, full.Lookup("w").W)
	for _, c := range []struct {
		dim, lo, hi int
		shape       []int
		want        func(i int) float64 // i-th value of the shard
	}{
		{0, 1, 3, []int{2, 6}, func(i int) float64 { return all[6+i] }},
		{1, 2, 5, []int{4, 3}, func(i int) float64 { return all[(i/3)*6+2+i%3] }},
	} {
		ps := NewParamSet(9)
		init, err := ShardInit(Normal(1), []int{4, 6}, c.dim, c.lo, c.hi)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ps.Add("w", c.shape, true, init); err != nil {
			t.Fatal(err)
		}
		noErr(t, b, ps.Materialize(b, tensor.Float64))
		got := download(t, b, ps.Lookup("w").W)
		for i := range got {
			if got[i] != c.want(i) {
				t.Fatalf("shard dim %d [%d, %d): value %d is %v, want %v", c.dim, c.lo, c.hi, i, got[i], c.want(i))
			}
		}
	}
}

func TestShardInitErrors(t *testing.T) {
	for _, c := range [][3]int{{2, 0, 1}, {0, 3, 3}, {1, -1, 2}, {1, 4, 7}} {
		if _, err := ShardInit(Normal(1), []int{4, 6}, c[0], c[1], c[2]); err == nil {
			t.Errorf("ShardInit(dim %d, [%d, %d)) of (4, 6) accepted", c[0], c[1], c[2])
		}
	}
	init, err := ShardInit(Normal(1), []int{4, 6}, 0, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, ps := newBackend(), NewParamSet(1)
	if _, err := ps.Add("w", []int{3, 6}, true, init); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "shard of the wrong size", ps.Materialize(b, tensor.Float32), "does its InitFunc fit the shape?")
}

// TestZeroParamSet: the zero value of ParamSet is a usable empty set of
// seed 0: layers register in it, and it materializes to the values
// NewParamSet(0) gives.
func TestZeroParamSet(t *testing.T) {
	b := newBackend()
	var zero ParamSet
	ref := NewParamSet(0)
	for _, ps := range []*ParamSet{&zero, ref} {
		if _, err := NewLinear(b, ps, "fc", LinearConfig{In: 3, Out: 2, Bias: true, Std: 0.5}); err != nil {
			t.Fatal(err)
		}
		noErr(t, b, ps.Materialize(b, tensor.Float64))
	}
	if zero.Lookup("fc.weight") == nil || zero.Numel() != 8 {
		t.Fatalf("the zero set holds %d values, fc.weight %v", zero.Numel(), zero.Lookup("fc.weight"))
	}
	got, _ := zero.Lookup("fc.weight").W.Float64s()
	want, _ := ref.Lookup("fc.weight").W.Float64s()
	for i := range want {
		if got[i] != want[i] || got[i] == 0 {
			t.Fatalf("zero set's fc.weight %v, NewParamSet(0)'s %v", got, want)
		}
	}
}

// TestStdZeroRefused: a weight of standard deviation 0 (the zero value of
// the configs) is refused naming the field, as is one that is negative or
// NaN or set together with Init; Init: Constant(0) asks for zero weights.
func TestStdZeroRefused(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	_, err := NewLinear(b, ps, "fc", LinearConfig{In: 3, Out: 2})
	wantErr(t, "Std 0", err, `linear "fc": LinearConfig.Std = 0, expected a finite value > 0`)
	_, err = NewLinear(b, ps, "fc", LinearConfig{In: 3, Out: 2, Std: math.NaN()})
	wantErr(t, "Std NaN", err, "LinearConfig.Std = NaN")
	_, err = NewLinear(b, ps, "fc", LinearConfig{In: 3, Out: 2, Std: -1})
	wantErr(t, "Std -1", err, "LinearConfig.Std = -1")
	_, err = NewLinear(b, ps, "fc", LinearConfig{In: 3, Out: 2, Std: 0.1, Init: Constant(0)})
	wantErr(t, "Std and Init", err, "LinearConfig.Std = 0.1 and")
	_, err = NewMLP(b, ps, "mlp", MLPConfig{Dim: 4, Hidden: 6, Std: 0.1})
	wantErr(t, "MLP OutStd 0", err, `mlp "mlp": MLPConfig.OutStd = 0`)
	_, err = NewAttention(b, ps, "attn", AttentionConfig{Dim: 4, Heads: 2, RopeTheta: 1e4, OutStd: 0.1})
	wantErr(t, "attention Std 0", err, `attention "attn": AttentionConfig.Std = 0`)
	if ps.Numel() != 0 {
		t.Errorf("refused layers registered %d values", ps.Numel())
	}
	_, err = NewBlock(b, NewParamSet(1), "blk", BlockConfig{Dim: 4, Heads: 2, FFN: 8, RopeTheta: 1e4})
	wantErr(t, "block Std 0", err, "AttentionConfig.Std = 0")
	lin, err := NewLinear(b, ps, "zero", LinearConfig{In: 3, Out: 2, Init: Constant(0)})
	noErr(t, b, err)
	noErr(t, b, ps.Materialize(b, tensor.Float32))
	if v, _ := lin.W.W.Float64s(); len(v) != 6 || slices.Max(v) != 0 || slices.Min(v) != 0 {
		t.Errorf("Init: Constant(0) gave %v, want zeros", v)
	}
}
