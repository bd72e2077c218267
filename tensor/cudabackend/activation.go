package cudabackend

import (
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// elementwise queues a grid-stride kernel over the n elements of ts[0].
func (b *Backend) elementwise(op, kernel string, ts []*tensor.Tensor, extra ...any) {
	n := ts[0].Numel()
	if n == 0 {
		return
	}
	args := make([]any, 0, len(ts)+len(extra)+1)
	for _, t := range ts {
		args = append(args, ptr(t))
	}
	args = append(args, extra...)
	args = append(args, int64(n))
	b.launch(op, kernel+sfx(ts[0].DType()), b.gridStride(n, packOf(ts[0].DType().Size())), gpu.D1(threads256), 0, args...)
}

// SwiGLU sets out = silu(gate)·up elementwise; all (N, F), out may alias an
// input.
func (b *Backend) SwiGLU(out, gate, up *tensor.Tensor) {
	c := b.check("SwiGLU")
	opcheck.Elementwise(c, []string{"gate", "up", "out"}, gate, up, out)
	if !c.OK() {
		return
	}
	b.elementwise("SwiGLU", "swiglu_fwd", []*tensor.Tensor{out, gate, up})
}

// SwiGLUBackward sets dgate and dup (overwritten) from dout, gate and up.
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up *tensor.Tensor) {
	c := b.check("SwiGLUBackward")
	opcheck.Elementwise(c, []string{"gate", "up", "dout", "dgate", "dup"}, gate, up, dout, dgate, dup)
	if !c.OK() {
		return
	}
	b.elementwise("SwiGLUBackward", "swiglu_bwd", []*tensor.Tensor{dgate, dup, dout, gate, up})
}

// GELU (tanh approximation) sets out = gelu(x); out may alias x.
func (b *Backend) GELU(out, x *tensor.Tensor) {
	c := b.check("GELU")
	opcheck.Elementwise(c, []string{"x", "out"}, x, out)
	if !c.OK() {
		return
	}
	b.elementwise("GELU", "gelu_fwd", []*tensor.Tensor{out, x})
}

// GELUBackward sets dx (overwritten) from dout and x.
func (b *Backend) GELUBackward(dx, dout, x *tensor.Tensor) {
	c := b.check("GELUBackward")
	opcheck.Elementwise(c, []string{"x", "dout", "dx"}, x, dout, dx)
	if !c.OK() {
		return
	}
	b.elementwise("GELUBackward", "gelu_bwd", []*tensor.Tensor{dx, dout, x})
}

// Softmax sets out = softmax(x) over the last dimension (one block per row).
func (b *Backend) Softmax(out, x *tensor.Tensor) {
	c := b.check("Softmax")
	n, cols := opcheck.Softmax(c, out, x)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 || cols == 0 {
		return
	}
	b.launch("Softmax", "softmax_fwd"+sfx(x.DType()), gpu.D1(n), rowBlock(cols, packOf(x.DType().Size())), 0,
		ptr(out), ptr(x), int32(n), int32(cols))
}

// SoftmaxBackward sets dx = out·(dout − Σ dout·out) row by row.
func (b *Backend) SoftmaxBackward(dx, dout, out *tensor.Tensor) {
	c := b.check("SoftmaxBackward")
	n, cols := opcheck.SoftmaxBackward(c, dx, dout, out)
	rowsFit(c, n, cols)
	if !c.OK() || n == 0 || cols == 0 {
		return
	}
	b.launch("SoftmaxBackward", "softmax_bwd"+sfx(out.DType()), gpu.D1(n), rowBlock(cols, packOf(out.DType().Size())), 0,
		ptr(dx), ptr(dout), ptr(out), int32(n), int32(cols))
}
