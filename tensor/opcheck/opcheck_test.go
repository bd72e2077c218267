package opcheck_test

import (
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// gpuLike is a policy shaped like a GPU backend's, over host tensors: bf16
// or f32 compute, fp32 side outputs, bf16 parameters updated through fp32.
var gpuLike = func() opcheck.Policy {
	bf16f32 := []tensor.DType{tensor.BFloat16, tensor.Float32}
	return opcheck.Policy{Prefix: "test", Own: opcheck.HostMemory, Floats: bf16f32, Params: bf16f32,
		Optim: []tensor.DType{tensor.Float32}, Upcast: true}
}()

func host(dt tensor.DType, shape ...int) *tensor.Tensor { return tensor.MustHost(dt, shape...) }

// run checks one op under pol and returns the error recorded ("" for none).
func run(pol *opcheck.Policy, op string, check func(c *opcheck.Checker)) string {
	var got error
	c := opcheck.New(pol, op, false, func(err error) { got = err })
	check(c)
	if c.OK() != (got == nil) {
		panic("OK disagrees with the recorded error")
	}
	if got == nil {
		return ""
	}
	return got.Error()
}

func TestPolicy(t *testing.T) {
	bf, f32, f64 := tensor.BFloat16, tensor.Float32, tensor.Float64
	hp := tensor.AdamW{Step: 1}
	noUpcast := gpuLike
	noUpcast.Upcast = false
	follows := gpuLike
	follows.SideFollowsOp = true
	for _, tc := range []struct {
		name  string
		op    string
		pol   *opcheck.Policy
		check func(c *opcheck.Checker)
		want  string // "" for no error
	}{
		{"bf16 p through fp32 moments", "AdamW", &gpuLike, func(c *opcheck.Checker) {
			opcheck.AdamW(c, host(bf, 4), host(bf, 4), host(f32, 4), host(f32, 4), nil, hp)
		}, ""},
		{"bf16 p needs a master without Upcast", "AdamW", &noUpcast, func(c *opcheck.Checker) {
			opcheck.AdamW(c, host(bf, 4), host(bf, 4), host(f32, 4), host(f32, 4), nil, hp)
		}, "test: AdamW: p is bf16(4)@cpu, expected f32, or an f32 master copy for a bf16 p"},
		{"f64 is not a compute dtype", "Scale", &gpuLike, func(c *opcheck.Checker) {
			opcheck.Elementwise(c, []string{"a", "dst"}, host(f64, 4), host(f64, 4))
		}, "test: Scale: a is f64(4)@cpu, expected bf16 or f32"},
		{"side output f32 only", "RMSNorm", &gpuLike, func(c *opcheck.Checker) {
			opcheck.RMSNorm(c, host(bf, 2, 3), host(bf, 2), host(bf, 2, 3), host(bf, 3))
		}, "test: RMSNorm: rstd is bf16(2)@cpu, expected dtype f32"},
		{"side output may follow the op", "RMSNorm", &follows, func(c *opcheck.Checker) {
			opcheck.RMSNorm(c, host(bf, 2, 3), host(bf, 2), host(bf, 2, 3), host(bf, 3))
		}, ""},
		{"first failure only", "MatMul", &gpuLike, func(c *opcheck.Checker) {
			opcheck.MatMul(c, host(f32, 4, 6), host(f32, 4, 3), host(f32, 2, 5), false, false)
		}, "test: MatMul: b has shape (2, 5), expected inner dimension 3"},
	} {
		got := run(tc.pol, tc.op, tc.check)
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: error %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSkip(t *testing.T) {
	c := opcheck.New(&gpuLike, "Add", true, func(error) { t.Fatal("a skipped op recorded an error") })
	opcheck.Elementwise(c, []string{"a"}, nil)
	if c.OK() {
		t.Fatal("a skipped op may run")
	}
}
