package backendtest

import (
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// errorCase is one op called with a bad argument.
type errorCase struct {
	op  string // the op the error must name
	run func(b tensor.Backend, dt tensor.DType)
}

var errorCases = []errorCase{
	{"MatMul", func(b tensor.Backend, dt tensor.DType) {
		b.MatMul(b.Zeros(dt, 4, 5), b.Zeros(dt, 4, 3), b.Zeros(dt, 2, 5), false, false, 1, 0) // inner dims 3 and 2
	}},
	{"MatMul", func(b tensor.Backend, dt tensor.DType) {
		b.MatMul(b.Zeros(dt, 4, 6), b.Zeros(dt, 4, 3), b.Zeros(dt, 3, 5), false, false, 1, 0) // c too wide
	}},
	{"Add", func(b tensor.Backend, dt tensor.DType) {
		b.Add(b.Zeros(dt, 4, 5), b.Zeros(dt, 4, 5), b.Zeros(dt, 5, 4))
	}},
	{"Scale", func(b tensor.Backend, dt tensor.DType) { b.Scale(b.Zeros(dt, 4, 5), b.Zeros(dt, 4, 6), 2) }},
	{"Axpy", func(b tensor.Backend, dt tensor.DType) { b.Axpy(b.Zeros(dt, 3), 2, b.Zeros(dt, 4)) }},
	{"AddBias", func(b tensor.Backend, dt tensor.DType) { b.AddBias(b.Zeros(dt, 4, 5), b.Zeros(dt, 4)) }},
	{"SumRows", func(b tensor.Backend, dt tensor.DType) { b.SumRows(b.Zeros(dt, 6), b.Zeros(dt, 4, 5)) }},
	{"RMSNorm", func(b tensor.Backend, dt tensor.DType) {
		b.RMSNorm(b.Zeros(dt, 4, 8), b.Zeros(tensor.Float32, 4), b.Zeros(dt, 4, 8), b.Zeros(dt, 7), 1e-5)
	}},
	{"RMSNormBackward", func(b tensor.Backend, dt tensor.DType) {
		b.RMSNormBackward(b.Zeros(dt, 4, 8), b.Zeros(dt, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 8), b.Zeros(tensor.Float32, 5))
	}},
	{"SwiGLU", func(b tensor.Backend, dt tensor.DType) {
		b.SwiGLU(b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 9))
	}},
	{"SwiGLUBackward", func(b tensor.Backend, dt tensor.DType) {
		b.SwiGLUBackward(b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 3, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 8))
	}},
	{"GELU", func(b tensor.Backend, dt tensor.DType) { b.GELU(b.Zeros(dt, 4, 8), b.Zeros(dt, 32)) }},
	{"GELUBackward", func(b tensor.Backend, dt tensor.DType) {
		b.GELUBackward(b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 7), b.Zeros(dt, 4, 8))
	}},
	{"Softmax", func(b tensor.Backend, dt tensor.DType) { b.Softmax(b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 9)) }},
	{"SoftmaxBackward", func(b tensor.Backend, dt tensor.DType) {
		b.SoftmaxBackward(b.Zeros(dt, 4, 8), b.Zeros(dt, 4, 8), b.Zeros(dt, 8, 4))
	}},
	{"RoPE", func(b tensor.Backend, dt tensor.DType) { b.RoPE(b.Zeros(dt, 1, 3, 2, 5), b.Zeros(dt, 1, 3, 2, 5), 1e4) }}, // odd D
	{"RoPEBackward", func(b tensor.Backend, dt tensor.DType) {
		b.RoPEBackward(b.Zeros(dt, 1, 3, 2, 4), b.Zeros(dt, 3, 2, 4), 1e4)
	}},
	{"Attention", func(b tensor.Backend, dt tensor.DType) {
		s := []int{2, 5, 3, 4}
		b.Attention(b.Zeros(dt, s...), b.Zeros(tensor.Float32, 2, 5, 3), b.Zeros(dt, s...), b.Zeros(dt, s...), b.Zeros(dt, s...), 0.5) // lse (B, T, H)
	}},
	{"Attention", func(b tensor.Backend, dt tensor.DType) { // 2 kv heads for 3 query heads
		s, kv := []int{2, 5, 3, 4}, []int{2, 5, 2, 4}
		b.Attention(b.Zeros(dt, s...), b.Zeros(tensor.Float32, 2, 3, 5), b.Zeros(dt, s...), b.Zeros(dt, kv...), b.Zeros(dt, kv...), 0.5)
	}},
	{"AttentionBackward", func(b tensor.Backend, dt tensor.DType) {
		s := []int{2, 5, 3, 4}
		z := func() *tensor.Tensor { return b.Zeros(dt, s...) }
		b.AttentionBackward(z(), z(), b.Zeros(dt, 2, 5, 3, 2), z(), z(), z(), z(), z(), b.Zeros(tensor.Float32, 2, 3, 5), 0.5)
	}},
	{"Embedding", func(b tensor.Backend, dt tensor.DType) {
		ids := b.Zeros(tensor.Int32, 3)
		b.Fill(ids, 7) // V = 7: out of range
		b.Embedding(b.Zeros(dt, 3, 4), b.Zeros(dt, 7, 4), ids)
	}},
	{"EmbeddingBackward", func(b tensor.Backend, dt tensor.DType) {
		b.EmbeddingBackward(b.Zeros(dt, 7, 4), b.Zeros(dt, 3, 5), b.Zeros(tensor.Int32, 3))
	}},
	{"CrossEntropy", func(b tensor.Backend, dt tensor.DType) {
		t := b.Zeros(tensor.Int32, 3)
		b.Fill(t, 5) // V = 5: out of range
		b.CrossEntropy(b.Zeros(tensor.Float32, 3), nil, b.Zeros(dt, 3, 5), t, 1)
	}},
	{"CrossEntropy", func(b tensor.Backend, dt tensor.DType) {
		b.CrossEntropy(b.Zeros(tensor.Float32, 3), b.Zeros(dt, 3, 4), b.Zeros(dt, 3, 5), b.Zeros(tensor.Int32, 3), 1)
	}},
	{"AdamW", func(b tensor.Backend, dt tensor.DType) {
		f := func(n int) *tensor.Tensor { return b.Zeros(tensor.Float32, n) }
		b.AdamW(b.Zeros(dt, 10), b.Zeros(dt, 10), f(10), f(9), f(10), tensor.AdamW{LR: 1, Beta1: 0.9, Beta2: 0.9, Step: 1})
	}},
	{"AdamW", func(b tensor.Backend, dt tensor.DType) { // NormSq of two elements
		f := func(n int) *tensor.Tensor { return b.Zeros(tensor.Float32, n) }
		b.AdamW(b.Zeros(dt, 10), b.Zeros(dt, 10), f(10), f(10), f(10), tensor.AdamW{LR: 1, Beta1: 0.9, Beta2: 0.9, Step: 1, NormSq: f(2)})
	}},
	{"SumSquaresTo", func(b tensor.Backend, dt tensor.DType) { b.SumSquaresTo(b.Zeros(tensor.Float32, 2), b.Zeros(dt, 10)) }},
	{"RoPEQKV", func(b tensor.Backend, dt tensor.DType) { // qkv of 2·H·D per token
		z := func() *tensor.Tensor { return b.Zeros(dt, 2, 3, 2, 4) }
		b.RoPEQKV(z(), z(), z(), b.Zeros(dt, 2, 3, 16), 1e4)
	}},
	{"RoPEQKV", func(b tensor.Backend, dt tensor.DType) { // qkv of 3·H·D per token for Hkv = H/2
		q, kv := b.Zeros(dt, 2, 3, 2, 4), func() *tensor.Tensor { return b.Zeros(dt, 2, 3, 1, 4) }
		b.RoPEQKV(q, kv(), kv(), b.Zeros(dt, 2, 3, 24), 1e4)
	}},
	{"RoPEQKVBackward", func(b tensor.Backend, dt tensor.DType) { // odd D
		z := func() *tensor.Tensor { return b.Zeros(dt, 2, 3, 2, 3) }
		b.RoPEQKVBackward(b.Zeros(dt, 2, 3, 18), z(), z(), z(), 1e4)
	}},
	{"AddRMSNorm", func(b tensor.Backend, dt tensor.DType) { // r of another width
		b.AddRMSNorm(b.Zeros(dt, 3, 4), b.Zeros(dt, 3, 4), b.Zeros(tensor.Float32, 3), b.Zeros(dt, 3, 4), b.Zeros(dt, 3, 5), b.Zeros(dt, 4), 1e-5)
	}},
	{"RMSNormBackwardAdd", func(b tensor.Backend, dt tensor.DType) { // dres of other rows
		z := func() *tensor.Tensor { return b.Zeros(dt, 3, 4) }
		b.RMSNormBackwardAdd(z(), b.Zeros(dt, 4), z(), z(), b.Zeros(dt, 4), b.Zeros(tensor.Float32, 3), b.Zeros(dt, 2, 4))
	}},
	{"SwiGLUPacked", func(b tensor.Backend, dt tensor.DType) { b.SwiGLUPacked(b.Zeros(dt, 3, 4), b.Zeros(dt, 3, 9)) }},
	{"SwiGLUPackedBackward", func(b tensor.Backend, dt tensor.DType) {
		b.SwiGLUPackedBackward(b.Zeros(dt, 3, 8), b.Zeros(dt, 3, 5), b.Zeros(dt, 3, 8))
	}},
	{"SumSquaresTo", func(b tensor.Backend, dt tensor.DType) { b.SumSquaresTo(b.Zeros(tensor.Int32, 1), b.Zeros(dt, 10)) }},
	{"Copy", func(b tensor.Backend, dt tensor.DType) { b.Copy(b.Zeros(dt, 4, 5), b.Zeros(tensor.Float32, 21)) }},
	{"MatMul", func(b tensor.Backend, dt tensor.DType) {
		b.MatMul(b.Zeros(dt, 4, 5), b.Zeros(tensor.Int32, 4, 3), b.Zeros(dt, 3, 5), false, false, 1, 0) // int32 operand
	}},
}

// TestErrors calls each op family with a bad shape (or dtype, or id) on a
// fresh backend from opts.NewBackend: the op must record an error naming it
// (not panic), and the error must stick: a later bad op does not replace
// it, a later good op does not clear it, Sync returns it.
func TestErrors(t *testing.T, b tensor.Backend, opts Options) {
	opts = opts.withDefaults()
	if opts.NewBackend == nil {
		t.Skip("Options.NewBackend is nil: the error tests need fresh backends")
	}
	for _, tc := range errorCases {
		fresh := opts.NewBackend()
		tc.run(fresh, opts.DType)
		err := fresh.Sync()
		if err == nil {
			t.Errorf("%s with a bad argument: no error", tc.op)
			continue
		}
		if !strings.Contains(err.Error(), tc.op) {
			t.Errorf("%s with a bad argument: error %q does not name the op", tc.op, err)
		}
		x := fresh.Zeros(opts.DType, 3)
		fresh.Fill(x, math.Pi)
		fresh.Add(x, x, fresh.Zeros(opts.DType, 4)) // a second bad op
		if err2 := fresh.Err(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%s: after later ops the error is %v, want the first one, %v", tc.op, err2, err)
		}
	}
}

// TestClearErr: after a bad Upload (8 values into a tensor of 6) on a fresh
// backend from opts.NewBackend, ClearErr (tensor.ErrClearer) clears the
// error; the destination is as it was, and later ops run and give the
// reference's values.
func TestClearErr(t *testing.T, b tensor.Backend, opts Options) {
	opts = opts.withDefaults()
	if opts.NewBackend == nil {
		t.Skip("Options.NewBackend is nil: the test needs a fresh backend")
	}
	fresh := opts.NewBackend()
	if _, ok := fresh.(tensor.ErrClearer); !ok {
		t.Skipf("the %s backend has no ClearErr (tensor.ErrClearer): its errors are cleared by making a new backend", fresh.Name())
	}
	rng := testutil.Rng(opts.Seed)
	x := fresh.Zeros(opts.DType, 2, 3)
	first := testutil.Rand(rng, tensor.Float64, 2, 3)
	fresh.Upload(x, first)
	fresh.Upload(x, testutil.Rand(rng, tensor.Float64, 4, 2)) // 8 values for 6
	if fresh.Sync() == nil {
		t.Fatal("Upload of a (4, 2) tensor into a (2, 3) one: no error")
	}
	if err := tensor.ClearErr(fresh); err != nil {
		t.Fatalf("ClearErr after a bad Upload: %v", err)
	}
	if err := fresh.Err(); err != nil {
		t.Fatalf("Err after ClearErr: %v", err)
	}
	y := fresh.Zeros(opts.DType, 2, 3)
	second := testutil.Rand(rng, tensor.Float64, 2, 3)
	fresh.Upload(y, second)
	fresh.Add(y, y, x)
	got := tensor.MustHost(tensor.Float64, 2, 3)
	fresh.Download(got, y)
	if err := fresh.Sync(); err != nil {
		t.Fatalf("ops after ClearErr: %v", err)
	}
	want := make([]float64, 6)
	for i := range want {
		want[i] = first.F64()[i] + second.F64()[i]
	}
	if err := testutil.Within("x + y after ClearErr", got.F64(), want, opts.Tol); err != nil {
		t.Error(err)
	}
}
