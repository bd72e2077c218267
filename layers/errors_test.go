package layers

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
)

func wantErr(t *testing.T, what string, err error, sub string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one containing %q", what, sub)
	} else if !strings.Contains(err.Error(), sub) {
		t.Errorf("%s: error %q, want one containing %q", what, err, sub)
	}
}

// TestGPTErrors: bad inputs give errors that say what was expected and what
// was found, before any op runs, so the backend holds no error afterwards
// and the model still works.
func TestGPTErrors(t *testing.T) {
	b := newBackend()
	m, err := NewGPT(b, tinyConfig, tensor.Float32)
	noErr(t, b, err)
	V, S := tinyConfig.Vocab, tinyConfig.Seq
	good := hostInts(t, []int32{1, 2, 3, 4, 5, 6}, 2, 3)

	wantErr(t, "Backward before Forward", m.Backward(), "needs a successful Forward with targets")

	ids := func(vals []int32, shape ...int) *tensor.Tensor { return hostInts(t, vals, shape...) }
	for _, c := range []struct {
		name         string
		ids, targets *tensor.Tensor
		want         string
	}{
		{"nil ids", nil, nil, "ids is nil"},
		{"float ids", tensor.MustHost(tensor.Float32, 2, 3), nil, "expected a host int32 tensor (B, T)"},
		{"1-D ids", ids([]int32{1, 2, 3}, 3), nil, "has shape (3), expected (B, T)"},
		{"empty ids", ids(nil, 0, 3), nil, "has shape (0, 3), expected (B, T) with B, T > 0"},
		{"T > Seq", ids(make([]int32, S+1), 1, S+1), nil, "T = 17 exceeds the model's Seq = 16"},
		{"id too large", ids([]int32{1, 2, 3, 4, int32(V), 6}, 2, 3), nil, "ids[4] = 29, expected a value in [0, 29)"},
		{"negative id", ids([]int32{1, -1, 3, 4, 5, 6}, 2, 3), nil, "ids[1] = -1, expected a value in [0, 29)"},
		{"targets shape", good, ids([]int32{1, 2, 3, 4, 5, 6}, 3, 2), "targets have shape (3, 2), expected (2, 3) like ids"},
		{"target too large", good, ids([]int32{1, 2, 3, 4, 5, 99}, 2, 3), "targets[5] = 99, expected a value < Vocab = 29"},
		{"float targets", good, tensor.MustHost(tensor.Float64, 2, 3), "targets is f64(2, 3)@cpu, expected a host int32 tensor"},
	} {
		_, err := m.Forward(c.ids, c.targets)
		wantErr(t, c.name, err, c.want)
		wantErr(t, c.name+", then Backward", m.Backward(), "needs a successful Forward with targets")
	}
	if err := b.Err(); err != nil {
		t.Fatalf("bad inputs left a backend error: %v", err)
	}

	_, err = m.Forward(good, nil)
	noErr(t, b, err)
	wantErr(t, "Backward after a Forward without targets", m.Backward(), "with targets")
	_, err = m.Forward(good, good)
	noErr(t, b, err)
	noErr(t, b, m.Backward())
	wantErr(t, "second Backward", m.Backward(), "since the last Backward")

	_, err = NewGPT(nil, tinyConfig, tensor.Float32)
	wantErr(t, "nil backend", err, "nil backend")
	_, err = NewGPT(b, tinyConfig, tensor.Int32)
	wantErr(t, "int32 model", err, "expected a float dtype")
}

// TestLayerErrors: shape, dtype and ordering mistakes in the layers are
// errors, and leave the backend clean.
func TestLayerErrors(t *testing.T) {
	b, ps := newBackend(), NewParamSet(1)
	lin, err := NewLinear(b, ps, "fc", LinearConfig{In: 4, Out: 3, Std: 0.1})
	noErr(t, b, err)
	emb, err := NewEmbedding(b, ps, "emb", 5, 4, 0.1)
	noErr(t, b, err)
	norm, err := NewRMSNorm(b, ps, "norm", 4, 1e-5)
	noErr(t, b, err)
	attn, err := NewAttention(b, ps, "attn", AttentionConfig{Dim: 4, Heads: 2, RopeTheta: 1e4, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	blk, err := NewBlock(b, ps, "blk", BlockConfig{Dim: 4, Heads: 1, FFN: 8, RopeTheta: 1e4, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	mlp, err := NewMLP(b, ps, "mlp", MLPConfig{Dim: 4, Hidden: 6, Std: 0.1, OutStd: 0.1})
	noErr(t, b, err)
	z := func(dt tensor.DType, shape ...int) *tensor.Tensor { return b.Zeros(dt, shape...) }
	f32 := tensor.Float32

	wantErr(t, "forward before Materialize", lin.Forward(z(f32, 2, 3), z(f32, 2, 4)), `parameter "fc.weight" is not materialized`)
	noErr(t, b, ps.Materialize(b, f32))

	wantErr(t, "linear backward first", lin.Backward(z(f32, 2, 4), z(f32, 2, 3)), "Backward without a successful Forward")
	wantErr(t, "linear x width", lin.Forward(z(f32, 2, 3), z(f32, 2, 5)), "input x has shape (2, 5), expected (..., 4)")
	wantErr(t, "linear y rows", lin.Forward(z(f32, 3, 3), z(f32, 2, 4)), "output y has shape (3, 3), expected 2 rows")
	wantErr(t, "linear dtype", lin.Forward(z(f32, 2, 3), z(tensor.Float64, 2, 4)), "expected dtype f32")
	wantErr(t, "linear host tensor", lin.Forward(z(f32, 2, 3), nil), "input x is nil")
	noErr(t, b, lin.Forward(z(f32, 2, 3), z(f32, 2, 4)))
	wantErr(t, "linear dy rows", lin.Backward(z(f32, 2, 4), z(f32, 5, 3)), "output gradient dy has shape (5, 3), expected 2 rows of 3")
	wantErr(t, "linear dx width", lin.Backward(z(f32, 2, 5), z(f32, 2, 3)), "input gradient dx has shape (2, 5)")
	noErr(t, b, lin.Backward(nil, z(f32, 2, 3)))

	ids := z(tensor.Int32, 3)
	b.Upload(ids, hostInts(t, []int32{0, 5, 1}, 3))
	wantErr(t, "embedding id range", emb.Forward(z(f32, 3, 4), ids), "ids[1] = 5, expected a value in [0, 5)")
	wantErr(t, "embedding float ids", emb.Forward(z(f32, 3, 4), z(f32, 3)), "expected dtype i32")
	wantErr(t, "embedding out shape", emb.Forward(z(f32, 3, 5), z(tensor.Int32, 3)), "output has shape (3, 5), expected (3, 4)")

	wantErr(t, "rmsnorm out shape", norm.Forward(z(f32, 2, 4), z(f32, 3, 4)), "output has shape (2, 4), expected (3, 4)")
	wantErr(t, "rmsnorm 1-D x", norm.Forward(z(f32, 4), z(f32, 4)), "input x has shape (4), expected (..., 4)")

	wantErr(t, "attention 2-D x", attn.Forward(z(f32, 6, 4), z(f32, 6, 4)), "input x has shape (6, 4), expected (B, T, 4)")
	noErr(t, b, attn.Forward(z(f32, 2, 3, 4), z(f32, 2, 3, 4)))
	wantErr(t, "attention dout shape", attn.Backward(z(f32, 2, 3, 4), z(f32, 3, 2, 4)), "output gradient has shape (3, 2, 4), expected (2, 3, 4)")

	x := z(f32, 1, 2, 4)
	wantErr(t, "block in place", blk.Forward(x, x), "output overlaps input x")
	noErr(t, b, blk.Forward(z(f32, 1, 2, 4), x))
	d := z(f32, 1, 2, 4)
	wantErr(t, "block dx = dout", blk.Backward(d, d), "input gradient dx overlaps output gradient")

	wantErr(t, "mlp backward first", mlp.Backward(z(f32, 2, 4), z(f32, 2, 4)), "Backward without a successful Forward")
	wantErr(t, "mlp nil dx", func() error {
		noErr(t, b, mlp.Forward(z(f32, 2, 4), z(f32, 2, 4)))
		return mlp.Backward(nil, z(f32, 2, 4))
	}(), "input gradient dx is nil")

	for name, fwd := range map[string]func(out, x *tensor.Tensor) error{
		"linear":  func(o, x *tensor.Tensor) error { return lin.Forward(must(o.View(0, 2, 3)), x) },
		"rmsnorm": norm.Forward, "mlp": mlp.Forward, "attention": attn.Forward,
	} {
		x := z(f32, 1, 2, 4)
		wantErr(t, name+" in place", fwd(x, x), "output"+map[bool]string{true: " y", false: ""}[name == "linear"]+" overlaps input x")
	}

	_, err = NewAttention(b, NewParamSet(1), "a", AttentionConfig{Dim: 6, Heads: 2, RopeTheta: 1e4})
	wantErr(t, "odd head dim", err, "head dim 3 = Dim/Heads is odd")
	_, err = NewLinear(b, NewParamSet(1), "l", LinearConfig{In: 0, Out: 2})
	wantErr(t, "zero In", err, "In = 0")

	if err := b.Err(); err != nil {
		t.Fatalf("layer errors left a backend error: %v", err)
	}
}

func must(t *tensor.Tensor, err error) *tensor.Tensor {
	if err != nil {
		panic(err)
	}
	return t
}
