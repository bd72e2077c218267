package backendtest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Options says how to test a backend.
type Options struct {
	// DType is the dtype the backend computes in: the dtype of parameters,
	// activations and their gradients (Float32 or BFloat16 on a GPU,
	// Float32 or Float64 on the CPU). Default Float32.
	DType tensor.DType
	// Tol is the largest accepted relative error (by norm) against the
	// float64 reference. Default 1e-2 for BFloat16, 1e-5 otherwise.
	Tol float64
	// Seed seeds the random inputs. Default 1.
	Seed uint64
	// NewBackend returns a fresh backend of the kind under test. The error
	// tests need one per case (errors are sticky); they are skipped when
	// NewBackend is nil.
	NewBackend func() tensor.Backend
}

func (o Options) withDefaults() Options {
	if o.DType == tensor.Invalid {
		o.DType = tensor.Float32
	}
	if o.Tol == 0 {
		o.Tol = 1e-5
		if o.DType == tensor.BFloat16 {
			o.Tol = 1e-2
		}
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	return o
}

// Test is one test of the suite.
type Test struct {
	Name string
	Fn   func(t *testing.T, b tensor.Backend, opts Options)
}

// Tests lists the tests that Run runs, in order (to run a subset).
func Tests() []Test {
	return []Test{
		{"Copy", TestCopy},
		{"Fill", TestFill},
		{"MatMul", TestMatMul},
		{"Elementwise", TestElementwise},
		{"Bias", TestBias},
		{"RMSNorm", TestRMSNorm},
		{"AddRMSNorm", TestAddRMSNorm},
		{"SwiGLU", TestSwiGLU},
		{"GELU", TestGELU},
		{"Softmax", TestSoftmax},
		{"RoPE", TestRoPE},
		{"Packed", TestPacked},
		{"Attention", TestAttention},
		{"Embedding", TestEmbedding},
		{"CrossEntropy", TestCrossEntropy},
		{"Narrow", TestNarrow},
		{"AdamW", TestAdamW},
		{"SumSquares", TestSumSquares},
		{"DeviceClip", TestDeviceClip},
		{"Errors", TestErrors},
		{"ClearErr", TestClearErr},
	}
}

// Run runs every test of the suite on b as a subtest. b must not hold an
// error; a test that leaves one makes the later tests fail.
func Run(t *testing.T, b tensor.Backend, opts Options) {
	t.Helper()
	if err := b.Err(); err != nil {
		t.Fatalf("backend %s holds an error before the suite: %v", b.Name(), err)
	}
	for _, tc := range Tests() {
		t.Run(tc.Name, func(t *testing.T) { tc.Fn(t, b, opts) })
	}
}

// harness runs ops on the backend under test and on the reference.
type harness struct {
	t   *testing.T
	b   tensor.Backend
	ref *cpu.Backend
	dt  tensor.DType
	tol float64
	rng *rand.Rand
}

// newHarness starts a test; salt makes each test's inputs its own.
func newHarness(t *testing.T, b tensor.Backend, opts Options, salt uint64) *harness {
	t.Helper()
	opts = opts.withDefaults()
	if err := b.Err(); err != nil {
		t.Fatalf("backend %s holds an error: %v", b.Name(), err)
	}
	return &harness{t: t, b: b, ref: cpu.New(), dt: opts.DType, tol: opts.Tol, rng: testutil.Rng(opts.Seed*1000 + salt)}
}

// pair is one operand: a tensor of the backend under test and the float64
// (or int32) host tensor the reference uses.
type pair struct {
	dev, ref *tensor.Tensor
}

// fromHost uploads host to the backend and keeps its exact values for the
// reference.
func (h *harness) fromHost(host *tensor.Tensor) pair {
	dev := h.b.Zeros(host.DType(), host.Shape()...)
	h.b.Upload(dev, host)
	if host.DType() == tensor.Int32 {
		ref := tensor.MustHost(tensor.Int32, host.Shape()...)
		copy(ref.I32(), host.I32())
		return pair{dev, ref}
	}
	ref := tensor.MustHost(tensor.Float64, host.Shape()...)
	vals, err := host.Float64s()
	if err != nil {
		h.t.Fatal(err)
	}
	copy(ref.F64(), vals)
	return pair{dev, ref}
}

// rand is an input of random values in ±[0.1, 1), rounded to dt.
func (h *harness) rand(dt tensor.DType, shape ...int) pair {
	return h.fromHost(testutil.Rand(h.rng, dt, shape...))
}

// values is an input of the given values, rounded to dt.
func (h *harness) values(dt tensor.DType, vals []float64, shape ...int) pair {
	host := tensor.MustHost(dt, shape...)
	if err := host.SetFloat64s(vals); err != nil {
		h.t.Fatal(err)
	}
	return h.fromHost(host)
}

// out is an output, poisoned with NaN on both sides.
func (h *harness) out(dt tensor.DType, shape ...int) pair {
	dev := h.b.Zeros(dt, shape...)
	h.b.Fill(dev, math.NaN())
	ref := tensor.MustHost(tensor.Float64, shape...)
	h.ref.Fill(ref, math.NaN())
	return pair{dev, ref}
}

// download returns the values of a tensor of the backend as float64.
func (h *harness) download(dev *tensor.Tensor) []float64 {
	h.t.Helper()
	host := tensor.MustHost(dev.DType(), dev.Shape()...)
	h.b.Download(host, dev)
	if err := h.b.Sync(); err != nil {
		h.t.Fatalf("backend %s: %v", h.b.Name(), err)
	}
	return testutil.Values(h.t, host)
}

// compare checks the backend's result against the reference's.
func (h *harness) compare(name string, p pair) {
	h.t.Helper()
	if err := h.ref.Err(); err != nil {
		h.t.Fatalf("%s: reference: %v", name, err)
	}
	h.compareValues(name, h.download(p.dev), testutil.Values(h.t, p.ref))
}

func (h *harness) compareValues(name string, got, want []float64) {
	h.t.Helper()
	if len(got) != len(want) {
		h.t.Fatalf("%s: got %d values, want %d", name, len(got), len(want))
	}
	for i, v := range got {
		if math.IsNaN(v) && !math.IsNaN(want[i]) {
			h.t.Errorf("%s: element %d is NaN, want %g (not written?)", name, i, want[i])
			return
		}
	}
	if e := testutil.RelErr(got, want); !(e <= h.tol) {
		h.t.Errorf("%s (%v): relative error %.3g > %.3g; first values got %v, want %v", name, h.dt, e, h.tol, head(got), head(want))
	}
}

func head(v []float64) string {
	if len(v) > 4 {
		return fmt.Sprint(v[:4]) + "..."
	}
	return fmt.Sprint(v)
}

// sync fails the test if the backend holds an error.
func (h *harness) sync() {
	h.t.Helper()
	if err := h.b.Sync(); err != nil {
		h.t.Fatalf("backend %s: %v", h.b.Name(), err)
	}
}
