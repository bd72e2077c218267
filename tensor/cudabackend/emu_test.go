//go:build asynctp_emu

package cudabackend

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/emu"
)

// openEmu opens a backend on the kernel emulator (CPU).
func openEmu(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	b, err := newBackend(emu.New(8), 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Logf("Close: %v", err)
		}
	})
	return b
}

func TestEmuConformance(t *testing.T) { runConformance(t, openEmu) }

func TestEmuConformanceSIMT(t *testing.T) {
	runConformance(t, openEmu, WithAttention(AttentionSIMT))
}

func TestEmuDeterminism(t *testing.T) { runDeterminism(t, openEmu) }

func TestEmuAttentionShapes(t *testing.T) { runAttentionShapes(t, openEmu) }

func TestEmuAttentionShapesSIMT(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionSIMT))
}

func TestEmuRoPEShapes(t *testing.T) { runRoPEShapes(t, openEmu) }

// TestEmuAttentionShapesFwdW8: the D = 64 forward with 8 warps × 16 rows.
func TestEmuAttentionShapesFwdW8(t *testing.T) {
	fa2FwdD64Warps = 8
	defer func() { fa2FwdD64Warps = 4 }()
	runAttentionShapes(t, openEmu, WithAttention(AttentionFA2))
}

// TestEmuAttentionShapesFA2: the FA2 kernels (TestEmuAttentionShapes runs
// the default, the wgmma backward: its fragment layouts, descriptors and
// swizzle as wgmma.cuh emulates them).
func TestEmuAttentionShapesFA2(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionFA2))
}

// TestEmuAttentionSameBits: the wgmma kernels give the FA2 kernels' bits.
func TestEmuAttentionSameBits(t *testing.T) { runAttentionSameBits(t, openEmu) }

func TestEmuRoutingPlan(t *testing.T) { runRoutingPlan(t, openEmu) }

func TestEmuGPT(t *testing.T) { runGPT(t, openEmu) }

func TestEmuRoutingAgreement(t *testing.T) { runRoutingAgreement(t, openEmu) }

// TestEmuCachingAllocator checks that freed blocks are reused without new
// device allocations, and that Close gives everything back.
func TestEmuCachingAllocator(t *testing.T) {
	d := emu.New(8)
	b, err := newBackend(d, 0, config{})
	if err != nil {
		t.Fatal(err)
	}
	base := d.Allocated()
	x := b.Zeros(tensor.BFloat16, 1000)
	y := b.Zeros(tensor.Float32, 300) // 1200 bytes: another size class than 2000
	if got := d.Allocated(); got != base+2 {
		t.Fatalf("%d device allocations after two Zeros, want %d", got, base+2)
	}
	b.Free(x)
	b.Free(y)
	for range 10 {
		z := b.Zeros(tensor.BFloat16, 990) // the class of x
		b.Free(z)
	}
	if got := d.Allocated(); got != base+2 {
		t.Fatalf("%d device allocations after reuse, want %d", got, base+2)
	}
	if st := b.MemStats(); st.Live != 0 || st.Cached == 0 {
		t.Fatalf("MemStats after freeing everything: %+v", st)
	}
	b.Free(y) // double free
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "already freed") {
		t.Fatalf("double Free: %v", err)
	}
	v := b.Zeros(tensor.Float32, 10)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := d.Allocated(); got != 0 {
		t.Fatalf("%d device allocations after Close, want 0", got)
	}
	b.Free(v) // after Close: harmless
}

// TestEmuReverseOrder reruns the suites with the threads of each block run
// in the opposite order between barriers: a missing barrier shows up as a
// difference in one of the two orders.
func TestEmuReverseOrder(t *testing.T) {
	emu.SetReverse(true)
	defer emu.SetReverse(false)
	t.Run("Conformance", func(t *testing.T) { runConformance(t, openEmu) })
	t.Run("AttentionShapes", func(t *testing.T) { runAttentionShapes(t, openEmu) })
	t.Run("RoutingPlan", func(t *testing.T) { runRoutingPlan(t, openEmu) })
}

// TestEmuStream: the emulator has no CUDA stream to hand a transport.
func TestEmuStream(t *testing.T) {
	b := openEmu(t)
	if s := b.Stream(); s != nil || b.StreamHandle() != 0 {
		t.Fatalf("Stream() = %v, StreamHandle() = %#x on the emulator, want nil and 0", s, b.StreamHandle())
	}
}

// TestEmuHasFA2: the emulated image has the FA2 and the wgmma attention
// kernels, and each option picks its own.
func TestEmuHasFA2(t *testing.T) {
	if b := openEmu(t); !b.hasFA2 || !b.useFA2() {
		t.Fatalf("hasFA2 = %v, useFA2 = %v on the emulator", b.hasFA2, b.useFA2())
	}
	if b := openEmu(t); !b.hasWG || !b.useWG() || !b.useWGFwd(128) || b.useWGFwd(64) {
		t.Fatal("the default backend does not pick the wgmma kernels on the emulator (the forward at D = 128 only)")
	}
	for _, a := range []AttentionImpl{AttentionFA2, AttentionSIMT} {
		if b := openEmu(t, WithAttention(a)); b.useWG() {
			t.Fatalf("WithAttention(%d) picks the wgmma kernels", a)
		}
	}
	if b := openEmu(t, WithAttention(AttentionFA2)); !b.useFA2() {
		t.Fatal("AttentionFA2 does not pick the FA2 kernels")
	}
	if b := openEmu(t, WithAttention(AttentionSIMT)); b.useTensorCores(tensor.BFloat16, 64) {
		t.Fatal("AttentionSIMT picks the tensor-core kernels")
	}
}

// TestEmuStrides runs the FA2 and the wgmma kernels on q, k, v that are
// column slices of one packed (B, T, (H + 2·Hkv)·D) projection and writes
// dq, dk, dv into slices of one packed gradient (the row strides of the
// fused projection), against the same kernels on contiguous copies: the
// same bits. The packed outputs start as NaN, so an element left unwritten
// fails.
func TestEmuStrides(t *testing.T) {
	for _, impl := range []struct {
		name string
		opt  AttentionImpl
	}{{"fa2", AttentionFA2}, {"wg", AttentionWGMMA}} {
		for _, s := range []attnShape{{2, 200, 3, 3, 64}, {1, 150, 2, 2, 128}, {1, 1, 2, 2, 64}, {1, 70, 2, 1, 64}, {1, 70, 4, 1, 128}} {
			t.Run(fmt.Sprintf("%s/%v", impl.name, s), func(t *testing.T) {
				testStrides(t, s, impl.opt)
			})
		}
	}
}

func testStrides(t *testing.T, s attnShape, opt AttentionImpl) {
	nb, nt, nh, hkv, d := s.nb, s.nt, s.nh, s.hkv, s.d
	qd, kd := nh*d, hkv*d
	w := qd + 2*kd
	b := openEmu(t, WithAttention(opt))
	rng := testutil.Rng(uint64(nt + d + hkv))
	host := testutil.Rand(rng, tensor.BFloat16, nb, nt, w)
	qkv := b.Zeros(tensor.BFloat16, nb, nt, w)
	b.Upload(qkv, host)
	view := func(x *tensor.Tensor, off, heads int) *tensor.Tensor {
		v, err := x.View(off, nb, nt, heads, d)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// contiguous uploads the columns [off, off + heads·D) of host's rows.
	contiguous := func(off, heads int) *tensor.Tensor {
		vals, _ := host.Float64s()
		part := tensor.MustHost(tensor.BFloat16, nb, nt, heads, d)
		pv := make([]float64, part.Numel())
		for r := range nb * nt {
			copy(pv[r*heads*d:(r+1)*heads*d], vals[r*w+off:])
		}
		if err := part.SetFloat64s(pv); err != nil {
			t.Fatal(err)
		}
		x := b.Zeros(tensor.BFloat16, nb, nt, heads, d)
		b.Upload(x, part)
		return x
	}
	q, k, v := view(qkv, 0, nh), view(qkv, qd, hkv), view(qkv, qd+kd, hkv)
	cq, ck, cv := contiguous(0, nh), contiguous(qd, hkv), contiguous(qd+kd, hkv)
	scale := float32(1 / math.Sqrt(float64(d)))
	packed := attnStrides{h: nh, hkv: hkv, q: w, kv: w, o: qd, dq: w, dkv: w}

	out, lse := b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.Float32, nb, nh, nt)
	b.Fill(out, math.NaN())
	b.Fill(lse, math.NaN())
	if b.useWGFwd(d) {
		b.attentionWG(out, lse, q, k, v, scale, nb, nt, d, packed)
	} else {
		b.attentionFA2(out, lse, q, k, v, scale, nb, nt, d, packed)
	}
	wout, wlse := b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.Float32, nb, nh, nt)
	b.Attention(wout, wlse, cq, ck, cv, scale)
	sameBits(t, "out", values(t, b, out), values(t, b, wout))
	sameBits(t, "lse", values(t, b, lse), values(t, b, wlse))

	dout := b.Zeros(tensor.BFloat16, nb, nt, nh, d)
	b.Upload(dout, testutil.Rand(rng, tensor.BFloat16, nb, nt, nh, d))
	dqkv := b.Zeros(tensor.BFloat16, nb, nt, w)
	b.Fill(dqkv, math.NaN())
	if b.useWG() {
		b.attentionBackwardWG(view(dqkv, 0, nh), view(dqkv, qd, hkv), view(dqkv, qd+kd, hkv), dout, q, k, v, out, lse, scale, nb, nt, d, packed)
	} else {
		b.attentionBackwardFA2(view(dqkv, 0, nh), view(dqkv, qd, hkv), view(dqkv, qd+kd, hkv), dout, q, k, v, out, lse, scale, nb, nt, d, packed)
	}
	want := [3]*tensor.Tensor{b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.BFloat16, nb, nt, hkv, d), b.Zeros(tensor.BFloat16, nb, nt, hkv, d)}
	b.AttentionBackward(want[0], want[1], want[2], dout, cq, ck, cv, out, lse, scale)
	got := values(t, b, dqkv)
	for part, p := range []struct {
		name      string
		off, cols int
	}{{"dq", 0, qd}, {"dk", qd, kd}, {"dv", qd + kd, kd}} {
		g := make([]float64, nb*nt*p.cols)
		for r := range nb * nt {
			copy(g[r*p.cols:(r+1)*p.cols], got[r*w+p.off:])
		}
		sameBits(t, p.name, g, values(t, b, want[part]))
	}
}

// sameBits fails unless got and want are equal bit for bit.
func sameBits(t *testing.T, name string, got, want []float64) {
	t.Helper()
	for i := range want {
		if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
			t.Errorf("%s: element %d is %v, want %v (the same kernels on contiguous tensors)", name, i, got[i], want[i])
			return
		}
	}
}

// TestEmuClearErrRefused: an error of a closed backend (as of the driver)
// is not cleared: ClearErr says to make a new backend, and Err keeps it.
func TestEmuClearErrRefused(t *testing.T) {
	b, err := newBackend(emu.New(8), 0, config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b.Fill(b.Zeros(tensor.Float32, 4), 1)
	before := b.Err()
	if before == nil {
		t.Fatal("an op on a closed backend recorded no error")
	}
	err = b.ClearErr()
	if err == nil || !strings.Contains(err.Error(), "make a new backend") {
		t.Fatalf("ClearErr on a closed backend: %v, want an error saying to make a new backend", err)
	}
	if b.Err() != before {
		t.Errorf("after a refused ClearErr, Err is %v, want %v", b.Err(), before)
	}
}
