package cudabackend

import (
	"fmt"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// AttentionWGMMA uses the kernels on Hopper's warpgroup MMA
// (cuda/kernels/attention_wg.cu) with FA2's bits: the backward in FA2's two
// deterministic launches (dq with delta, then dk and dv; no atomics,
// bit-reproducible), and the forward at D = 128, on wgmma instead of
// mma.sync; the forward at D = 64 stays FA2's (attention_fa2.cu; a wgmma
// one was an experiment whose lse was not FA2's bits, retired to
// cuda/kernels/experimental/). It needs an sm_90 GPU and an image with
// sm_90a code (or the emulator); elsewhere, and where the tensor-core
// kernels do not apply, it falls back like AttentionFA2. AttentionAuto takes
// it where it runs.
const AttentionWGMMA = AttentionSIMT + 1

// AttentionFA2 uses the second-generation kernels (attention_fa2.cu,
// mma.sync) forward and backward where the tensor-core kernels apply, also
// on sm_90 (AttentionAuto's choice before the wgmma kernels; for
// comparisons).
const AttentionFA2 = AttentionWGMMA + 1

// wgKernelProbe is a kernel whose presence says the image has them.
const wgKernelProbe = "attn_bwd_dq_wg_d64_bf16"

// wgRows is the rows (queries or keys) each block of the wgmma kernels owns.
const wgRows = 64

// wgStepDq is the key tile the dq kernel streams (its BN).
const wgStepDq = 64

// wgStepDkdv is the query tile the dk/dv kernel streams: 64 for D = 64, 32
// for D = 128 (registers).
func wgStepDkdv(d int) int {
	if d == 128 {
		return 32
	}
	return 64
}

// wgSmemDq: 1024 bytes to align the tiles, Q and dO (64 rows), two buffers
// each of K and V (64 rows); rows of D bf16.
func wgSmemDq(d int) int { return 1024 + (2*wgRows+4*wgStepDq)*d*2 }

// wgSmemDkdv: the alignment, K and V (64 rows), two buffers each of Q and
// dO (step rows) and of lse and delta (step floats each).
func wgSmemDkdv(d int) int { s := wgStepDkdv(d); return 1024 + (2*wgRows+4*s)*d*2 + 16*s }

// wgDevice says whether d runs the wgmma kernels: the emulator does; a GPU
// must be sm_90 (the image's sm_90a code).
func wgDevice(d gpu.Device) bool {
	if !d.HasKernel(wgKernelProbe) {
		return false
	}
	cd, ok := d.(*cudaDevice)
	if !ok {
		return true
	}
	dev, err := cuda.GetDevice(cd.ordinal)
	if err != nil {
		return false
	}
	major, minor, err := dev.ComputeCapability()
	return err == nil && major == 9 && minor == 0
}

// useWG says whether the backward takes the wgmma kernels.
func (b *Backend) useWG() bool {
	a := b.cfg.attention
	return b.hasWG && (a == AttentionAuto || a == AttentionWGMMA)
}

// useWGFwd says whether the forward at head dim d takes the wgmma kernel
// (D = 128).
func (b *Backend) useWGFwd(d int) bool { return d == 128 && b.useWG() }

// wgSmemFwd: the alignment, Q (64 rows), two buffers of K and three of V
// (64 rows each: the kernel is software-pipelined); rows of D bf16.
func wgSmemFwd(d int) int { return 1024 + (wgRows+5*64)*d*2 }

// attentionWG launches the wgmma forward (attn_fwd_wg_d128_bf16); heads and
// strides as attentionFA2.
func (b *Backend) attentionWG(out, lse, q, k, v *tensor.Tensor, scale float32, nb, nt, d int, st attnStrides) {
	grid := gpu.D2(ceilDiv(nt, wgRows), nb*st.h)
	b.launch("Attention", fmt.Sprintf("attn_fwd_wg_d%d_bf16", d), grid, gpu.D1(128), wgSmemFwd(d),
		ptr(out), ptr(lse), ptr(q), ptr(k), ptr(v), int32(nb), int32(nt), int32(st.h), int32(st.hkv),
		int32(st.q), int32(st.kv), int32(st.o), scale)
}

// attentionBackwardWG launches dq (with delta) and then dk, dv on the wgmma
// kernels; heads and strides as attentionBackwardFA2.
func (b *Backend) attentionBackwardWG(dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, d int, st attnStrides) {
	b.attentionBackwardTwoPass(twoPass{"wg", wgRows, 128, wgSmemDq(d), wgSmemDkdv(d)},
		dq, dk, dv, dout, q, k, v, out, lse, scale, nb, nt, d, st)
}
