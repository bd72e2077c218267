package cpu_test

import (
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// gpuBuffer pretends to be device memory, to check that host-only ops
// reject it.
type gpuBuffer struct{ n int }

func (g gpuBuffer) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA} }
func (g gpuBuffer) DType() tensor.DType   { return tensor.Float32 }
func (g gpuBuffer) Len() int              { return g.n }

func f32(shape ...int) *tensor.Tensor { return tensor.MustHost(tensor.Float32, shape...) }
func i32(vals ...int32) *tensor.Tensor {
	t, _ := tensor.FromInt32(vals, len(vals))
	return t
}

func TestErrors(t *testing.T) {
	onGPU, err := tensor.New(gpuBuffer{12}, 0, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	adam := tensor.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.99, Step: 1}
	cases := []struct {
		name string
		run  func(b *cpu.Backend)
		want string // a part of the error
	}{
		{"MatMul inner", func(b *cpu.Backend) { b.MatMul(f32(4, 5), f32(4, 3), f32(2, 5), false, false, 1, 0) },
			"cpu: MatMul: b has shape (2, 5), expected inner dimension 3"},
		{"MatMul c", func(b *cpu.Backend) { b.MatMul(f32(4, 6), f32(3, 4), f32(3, 5), true, false, 1, 0) },
			"cpu: MatMul: c has shape (4, 6), expected (4, 5)"},
		{"MatMul batch", func(b *cpu.Backend) { b.MatMul(f32(2, 4, 5), f32(2, 4, 3), f32(3, 3, 5), false, false, 1, 0) },
			"cpu: MatMul: batch dimensions"},
		{"MatMul rank", func(b *cpu.Backend) { b.MatMul(f32(4, 5), f32(1, 4, 3), f32(3, 5), false, false, 1, 0) },
			"cpu: MatMul: b has shape (3, 5), expected 3 dimensions"},
		{"MatMul dtype", func(b *cpu.Backend) { b.MatMul(f32(4, 5), f32(4, 3), zeros(3, 5), false, false, 1, 0) },
			"cpu: MatMul: b is f64(3, 5)@cpu, expected dtype f32"},
		{"MatMul bf16", func(b *cpu.Backend) {
			b.MatMul(f32(4, 5), tensor.MustHost(tensor.BFloat16, 4, 3), f32(3, 5), false, false, 1, 0)
		}, "expected f32 or f64"},
		{"MatMul nil", func(b *cpu.Backend) { b.MatMul(nil, f32(4, 3), f32(3, 5), false, false, 1, 0) }, "cpu: MatMul: c is nil"},
		{"Add", func(b *cpu.Backend) { b.Add(f32(4, 5), f32(4, 5), f32(5, 4)) }, "cpu: Add: b has shape (5, 4), expected (4, 5) to match a"},
		{"Scale", func(b *cpu.Backend) { b.Scale(zeros(4), f32(4), 2) }, "cpu: Scale: dst is f64(4)@cpu, expected dtype f32"},
		{"Axpy", func(b *cpu.Backend) { b.Axpy(f32(3), 2, f32(4)) }, "cpu: Axpy: y has shape (3)"},
		{"AddBias", func(b *cpu.Backend) { b.AddBias(f32(4, 5), f32(4)) }, "cpu: AddBias: bias has shape (4), expected (5)"},
		{"SumRows", func(b *cpu.Backend) { b.SumRows(f32(6), f32(4, 5)) }, "cpu: SumRows: dst has shape (6), expected (5)"},
		{"RMSNorm", func(b *cpu.Backend) { b.RMSNorm(f32(4, 8), f32(4), f32(4, 8), f32(7), 1e-5) },
			"cpu: RMSNorm: w has shape (7), expected (8) to match the last dim of x (4, 8)"},
		{"RMSNorm rstd dtype", func(b *cpu.Backend) { b.RMSNorm(f32(4, 8), zeros(4), f32(4, 8), f32(8), 1e-5) },
			"cpu: RMSNorm: rstd is f64(4)@cpu, expected dtype f32"},
		{"RMSNormBackward", func(b *cpu.Backend) { b.RMSNormBackward(f32(4, 8), f32(8), f32(4, 8), f32(4, 8), f32(8), f32(5)) },
			"cpu: RMSNormBackward: rstd has shape (5), expected (4)"},
		{"SwiGLU", func(b *cpu.Backend) { b.SwiGLU(f32(4, 8), f32(4, 8), f32(4, 9)) }, "cpu: SwiGLU: up has shape (4, 9)"},
		{"SwiGLUBackward", func(b *cpu.Backend) { b.SwiGLUBackward(f32(4, 8), f32(4, 8), f32(3, 8), f32(4, 8), f32(4, 8)) },
			"cpu: SwiGLUBackward: dout has shape (3, 8)"},
		{"GELU", func(b *cpu.Backend) { b.GELU(f32(4, 8), f32(32)) }, "cpu: GELU: out has shape (4, 8), expected (32)"},
		{"GELUBackward", func(b *cpu.Backend) { b.GELUBackward(f32(4, 8), f32(4, 7), f32(4, 8)) }, "cpu: GELUBackward: dout"},
		{"Softmax", func(b *cpu.Backend) { b.Softmax(f32(4, 8), f32(4, 9)) }, "cpu: Softmax: out has shape (4, 8)"},
		{"Softmax scalar", func(b *cpu.Backend) { b.Softmax(f32(), f32()) }, "cpu: Softmax: x has shape (), expected 1 to 8"},
		{"SoftmaxBackward", func(b *cpu.Backend) { b.SoftmaxBackward(f32(4, 8), f32(4, 8), f32(8, 4)) }, "cpu: SoftmaxBackward: dout"},
		{"RoPE odd", func(b *cpu.Backend) { b.RoPE(f32(1, 3, 2, 5), f32(1, 3, 2, 5), 1e4) }, "cpu: RoPE: x has shape (1, 3, 2, 5), expected an even head dim"},
		{"RoPE rank", func(b *cpu.Backend) { b.RoPE(f32(3, 2, 4), f32(3, 2, 4), 1e4) }, "cpu: RoPE: x has shape (3, 2, 4), expected 4 dimensions"},
		{"RoPEBackward", func(b *cpu.Backend) { b.RoPEBackward(f32(1, 3, 2, 6), f32(1, 3, 2, 4), 1e4) }, "cpu: RoPEBackward: dx"},
		{"Attention", func(b *cpu.Backend) {
			b.Attention(f32(2, 5, 3, 4), f32(2, 5, 3), f32(2, 5, 3, 4), f32(2, 5, 3, 4), f32(2, 5, 3, 4), 0.5)
		}, "cpu: Attention: lse has shape (2, 5, 3), expected (2, 3, 5)"},
		{"Attention k", func(b *cpu.Backend) {
			b.Attention(f32(2, 5, 3, 4), f32(2, 3, 5), f32(2, 5, 3, 4), f32(2, 5, 3, 2), f32(2, 5, 3, 4), 0.5)
		}, "cpu: Attention: k has shape (2, 5, 3, 2)"},
		{"Attention kv heads", func(b *cpu.Backend) { // 2 kv heads do not divide 3 query heads
			b.Attention(f32(2, 5, 3, 4), f32(2, 3, 5), f32(2, 5, 3, 4), f32(2, 5, 2, 4), f32(2, 5, 2, 4), 0.5)
		}, "cpu: Attention: k has shape (2, 5, 2, 4), expected (2, 5, Hkv, 4) with Hkv dividing the 3 heads of q (2, 5, 3, 4)"},
		{"Attention v", func(b *cpu.Backend) {
			b.Attention(f32(2, 5, 4, 4), f32(2, 4, 5), f32(2, 5, 4, 4), f32(2, 5, 2, 4), f32(2, 5, 4, 4), 0.5)
		}, "cpu: Attention: v has shape (2, 5, 4, 4), expected (2, 5, 2, 4) to match k"},
		{"AttentionBackward dk", func(b *cpu.Backend) { // dk like q, not like k
			s, kv := []int{2, 5, 4, 4}, []int{2, 5, 2, 4}
			b.AttentionBackward(f32(s...), f32(s...), f32(kv...), f32(s...), f32(s...), f32(kv...), f32(kv...), f32(s...), f32(2, 4, 5), 0.5)
		}, "cpu: AttentionBackward: dk has shape (2, 5, 4, 4), expected (2, 5, 2, 4) to match k"},
		{"RoPEQKV grouped", func(b *cpu.Backend) { // qkv of (H + 2·H)·D per token for 2 kv heads
			b.RoPEQKV(f32(1, 3, 4, 4), f32(1, 3, 2, 4), f32(1, 3, 2, 4), f32(1, 3, 48), 1e4)
		}, "cpu: RoPEQKV: qkv has shape (1, 3, 48), expected (1, 3, 32)"},
		{"AttentionBackward", func(b *cpu.Backend) {
			s := []int{2, 5, 3, 4}
			b.AttentionBackward(f32(s...), f32(s...), f32(2, 5, 3, 2), f32(s...), f32(s...), f32(s...), f32(s...), f32(s...), f32(2, 3, 5), 0.5)
		}, "cpu: AttentionBackward: dv has shape (2, 5, 3, 2)"},
		{"Embedding id", func(b *cpu.Backend) { b.Embedding(f32(3, 4), f32(7, 4), i32(1, 7, 2)) },
			"cpu: Embedding: ids[1] = 7 is outside [0, 7)"},
		{"Embedding negative id", func(b *cpu.Backend) { b.Embedding(f32(3, 4), f32(7, 4), i32(1, 2, -1)) },
			"cpu: Embedding: ids[2] = -1 is outside [0, 7)"},
		{"Embedding ids dtype", func(b *cpu.Backend) { b.Embedding(f32(3, 4), f32(7, 4), f32(3)) },
			"cpu: Embedding: ids is f32(3)@cpu, expected dtype i32"},
		{"EmbeddingBackward", func(b *cpu.Backend) { b.EmbeddingBackward(f32(7, 4), f32(3, 5), i32(0, 1, 2)) },
			"cpu: EmbeddingBackward: dout has shape (3, 5), expected (3, 4)"},
		{"CrossEntropy target", func(b *cpu.Backend) { b.CrossEntropy(f32(3), nil, f32(3, 5), i32(0, 5, 1), 1) },
			"cpu: CrossEntropy: targets[1] = 5, expected < V = 5"},
		{"CrossEntropy losses", func(b *cpu.Backend) { b.CrossEntropy(f32(4), nil, f32(3, 5), i32(0, 1, 1), 1) },
			"cpu: CrossEntropy: losses has shape (4), expected (3)"},
		{"CrossEntropy dlogits", func(b *cpu.Backend) { b.CrossEntropy(f32(3), f32(3, 4), f32(3, 5), i32(0, 1, 1), 1) },
			"cpu: CrossEntropy: dlogits has shape (3, 4)"},
		{"AdamW numel", func(b *cpu.Backend) { b.AdamW(f32(10), f32(10), f32(10), f32(9), nil, adam) },
			"cpu: AdamW: v f32(9)@cpu has 9 elements, expected 10"},
		{"AdamW step", func(b *cpu.Backend) { b.AdamW(f32(10), f32(10), f32(10), f32(10), nil, tensor.AdamW{}) },
			"cpu: AdamW: hp.Step = 0, expected ≥ 1"},
		{"AdamW bf16 without master", func(b *cpu.Backend) {
			p := tensor.MustHost(tensor.BFloat16, 10)
			b.AdamW(p, p, f32(10), f32(10), nil, adam)
		}, "cpu: AdamW: p is bf16(10)@cpu, expected f32 or f64, or an f32 master"},
		{"AdamW moments", func(b *cpu.Backend) { b.AdamW(f32(10), f32(10), zeros(10), f32(10), nil, adam) },
			"cpu: AdamW: m is f64(10)@cpu, expected dtype f32"},
		{"SumSquares", func(b *cpu.Backend) { b.SumSquares(i32(1, 2)) }, "cpu: SumSquares: x is i32(2)@cpu, expected a float tensor"},
		{"Copy numel", func(b *cpu.Backend) { b.Copy(f32(4, 5), f32(21)) }, "cpu: Copy: dst f32(4, 5)@cpu has 20 elements, expected 21"},
		{"Copy int", func(b *cpu.Backend) { b.Copy(f32(2), i32(1, 2)) }, "cpu: Copy: cannot convert i32(2)@cpu to f32(2)@cpu"},
		{"Upload device", func(b *cpu.Backend) { b.Upload(onGPU, f32(3, 4)) }, "cpu: Upload: dst is f32(3, 4)@cuda:0, expected a tensor in host memory"},
		{"Download device", func(b *cpu.Backend) { b.Download(f32(3, 4), onGPU) }, "cpu: Download: src is f32(3, 4)@cuda:0"},
		{"Add device", func(b *cpu.Backend) { b.Add(f32(3, 4), onGPU, f32(3, 4)) }, "cpu: Add: a is f32(3, 4)@cuda:0"},
		{"Fill int NaN", func(b *cpu.Backend) { b.Fill(i32(1), math.NaN()) }, "cpu: Fill: value NaN does not fit i32(1)@cpu"},
		{"Zeros", func(b *cpu.Backend) {
			if z := b.Zeros(tensor.Float32, 2, -1); z == nil {
				panic("nil tensor")
			}
		}, "cpu: Zeros(f32, (2, -1))"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := cpu.New()
			tc.run(b)
			err := b.Err()
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want one containing %q", err, tc.want)
			}
			// Later ops are no-ops and keep the first error.
			x := f32(3)
			b.Fill(x, 1)
			b.Add(x, x, f32(4))
			if x.F32()[0] != 0 {
				t.Errorf("Fill after the error wrote %v", x.F32())
			}
			if got := b.SumSquares(f32(3)); !math.IsNaN(got) {
				t.Errorf("SumSquares after the error = %v, want NaN", got)
			}
			if err2 := b.Sync(); err2 != err {
				t.Errorf("Sync = %v, want the first error %v", err2, err)
			}
		})
	}
}

// TestErrorLeavesOutputs checks that an op that fails validation writes
// nothing, even to the outputs it could have written.
func TestErrorLeavesOutputs(t *testing.T) {
	b := cpu.New()
	out, losses := f32(3, 5), f32(3)
	b.Fill(out, 7)
	b.Fill(losses, 7)
	b.CrossEntropy(losses, out, f32(3, 5), i32(0, 1, 9), 1) // the last target is out of range
	if b.Err() == nil {
		t.Fatal("no error")
	}
	for _, v := range append(out.F32(), losses.F32()...) {
		if v != 7 {
			t.Fatalf("a failed CrossEntropy wrote %v", v)
		}
	}
}

// TestNilArguments passes nil for each tensor argument of each op in turn:
// the op must record an error (where the argument is not optional), never
// panic.
func TestNilArguments(t *testing.T) {
	s4 := []int{1, 3, 2, 4}
	adam := tensor.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.99, Step: 1}
	ops := []struct {
		name     string
		args     func() []*tensor.Tensor
		optional int // index of an argument that may be nil, or −1
		run      func(b *cpu.Backend, a []*tensor.Tensor)
	}{
		{"MatMul", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2, 3), f32(2, 4), f32(4, 3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.MatMul(a[0], a[1], a[2], false, false, 1, 0) }},
		{"Add", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Add(a[0], a[1], a[2]) }},
		{"Scale", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Scale(a[0], a[1], 2) }},
		{"Axpy", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Axpy(a[0], 2, a[1]) }},
		{"AddBias", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2, 3), f32(3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.AddBias(a[0], a[1]) }},
		{"SumRows", func() []*tensor.Tensor { return []*tensor.Tensor{f32(3), f32(2, 3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.SumRows(a[0], a[1]) }},
		{"RMSNorm", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2, 3), f32(2), f32(2, 3), f32(3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.RMSNorm(a[0], a[1], a[2], a[3], 1e-5) }},
		{"RMSNormBackward", func() []*tensor.Tensor {
			return []*tensor.Tensor{f32(2, 3), f32(3), f32(2, 3), f32(2, 3), f32(3), f32(2)}
		}, -1, func(b *cpu.Backend, a []*tensor.Tensor) { b.RMSNormBackward(a[0], a[1], a[2], a[3], a[4], a[5]) }},
		{"SwiGLU", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.SwiGLU(a[0], a[1], a[2]) }},
		{"SwiGLUBackward", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2), f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.SwiGLUBackward(a[0], a[1], a[2], a[3], a[4]) }},
		{"GELU", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.GELU(a[0], a[1]) }},
		{"GELUBackward", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.GELUBackward(a[0], a[1], a[2]) }},
		{"Softmax", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Softmax(a[0], a[1]) }},
		{"SoftmaxBackward", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.SoftmaxBackward(a[0], a[1], a[2]) }},
		{"RoPE", func() []*tensor.Tensor { return []*tensor.Tensor{f32(s4...), f32(s4...)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.RoPE(a[0], a[1], 1e4) }},
		{"RoPEBackward", func() []*tensor.Tensor { return []*tensor.Tensor{f32(s4...), f32(s4...)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.RoPEBackward(a[0], a[1], 1e4) }},
		{"Attention", func() []*tensor.Tensor {
			return []*tensor.Tensor{f32(s4...), f32(1, 2, 3), f32(s4...), f32(s4...), f32(s4...)}
		}, -1, func(b *cpu.Backend, a []*tensor.Tensor) { b.Attention(a[0], a[1], a[2], a[3], a[4], 1) }},
		{"AttentionBackward", func() []*tensor.Tensor {
			return []*tensor.Tensor{f32(s4...), f32(s4...), f32(s4...), f32(s4...), f32(s4...), f32(s4...), f32(s4...), f32(s4...), f32(1, 2, 3)}
		}, -1, func(b *cpu.Backend, a []*tensor.Tensor) {
			b.AttentionBackward(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], 1)
		}},
		{"Embedding", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2, 3), f32(4, 3), i32(0, 3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Embedding(a[0], a[1], a[2]) }},
		{"EmbeddingBackward", func() []*tensor.Tensor { return []*tensor.Tensor{f32(4, 3), f32(2, 3), i32(0, 3)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.EmbeddingBackward(a[0], a[1], a[2]) }},
		{"CrossEntropy", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2, 3), f32(2, 3), i32(0, 2)} }, 1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.CrossEntropy(a[0], a[1], a[2], a[3], 1) }},
		{"AdamW", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2), f32(2), f32(2), f32(2)} }, 4,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.AdamW(a[0], a[1], a[2], a[3], a[4], adam) }},
		{"SumSquares", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.SumSquares(a[0]) }},
		{"Copy", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2), f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Copy(a[0], a[1]) }},
		{"Fill", func() []*tensor.Tensor { return []*tensor.Tensor{f32(2)} }, -1,
			func(b *cpu.Backend, a []*tensor.Tensor) { b.Fill(a[0], 1) }},
	}
	for _, op := range ops {
		b := cpu.New()
		op.run(b, op.args())
		if err := b.Err(); err != nil {
			t.Fatalf("%s with valid arguments: %v", op.name, err)
		}
		for i := range op.args() {
			b := cpu.New()
			args := op.args()
			args[i] = nil
			op.run(b, args)
			if err := b.Err(); (err == nil) != (i == op.optional) {
				t.Errorf("%s with argument %d nil: error %v", op.name, i, err)
			}
		}
	}
}
