//go:build asynctp_emu

package cudabackend

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testutil"
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

func TestEmuAttentionShapesTC1(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionTC1))
}

// TestEmuAttentionShapesFA2Atomic: the one-pass backward (dq by atomics).
func TestEmuAttentionShapesFA2Atomic(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionFA2Atomic))
}

// TestEmuAttentionShapesFA2: the FA2 kernels (TestEmuAttentionShapes runs
// the default, the wgmma backward: its fragment layouts, descriptors and
// swizzle as wgmma.cuh emulates them).
func TestEmuAttentionShapesFA2(t *testing.T) {
	runAttentionShapes(t, openEmu, WithAttention(AttentionFA2))
}

// TestEmuAttentionSameBits: the wgmma kernels give the FA2 kernels' bits.
func TestEmuAttentionSameBits(t *testing.T) { runAttentionSameBits(t, openEmu) }

// TestEmuAttentionWGFwdD64: the experimental D = 64 wgmma forwards give
// FA2's bits in the emulator.
func TestEmuAttentionWGFwdD64(t *testing.T) { runAttentionWGFwdD64(t, openEmu) }

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
	t.Run("AttentionShapesFA2Atomic", func(t *testing.T) { runAttentionShapes(t, openEmu, WithAttention(AttentionFA2Atomic)) })
	t.Run("RoutingPlan", func(t *testing.T) { runRoutingPlan(t, openEmu) })
}

// TestEmuStream: the emulator has no CUDA stream to hand a transport.
func TestEmuStream(t *testing.T) {
	b := openEmu(t)
	if s := b.Stream(); s != nil || b.StreamHandle() != 0 {
		t.Fatalf("Stream() = %v, StreamHandle() = %#x on the emulator, want nil and 0", s, b.StreamHandle())
	}
}

// TestEmuHasFA2: the emulated image has the second-generation and the
// wgmma attention kernels, and each option picks its own.
func TestEmuHasFA2(t *testing.T) {
	if b := openEmu(t); !b.hasFA2 || !b.useFA2() {
		t.Fatalf("hasFA2 = %v, useFA2 = %v on the emulator", b.hasFA2, b.useFA2())
	}
	if b := openEmu(t, WithAttention(AttentionTC1)); b.useFA2() {
		t.Fatal("AttentionTC1 still picks the FA2 kernels")
	}
	if b := openEmu(t); b.useOnePass() {
		t.Fatal("the default backend picks the one-pass (atomic) backward")
	}
	if b := openEmu(t, WithAttention(AttentionFA2Atomic)); !b.useFA2() || !b.useOnePass() {
		t.Fatal("AttentionFA2Atomic does not pick the FA2 forward and the one-pass backward")
	}
	if b := openEmu(t); !b.hasWG || !b.useWG() || b.useOnePass() {
		t.Fatal("the default backend does not pick the wgmma kernels on the emulator")
	}
	for _, a := range []AttentionImpl{AttentionFA2, AttentionFA2Atomic, AttentionTC1, AttentionSIMT} {
		if b := openEmu(t, WithAttention(a)); b.useWG() {
			t.Fatalf("WithAttention(%d) picks the wgmma kernels", a)
		}
	}
	if b := openEmu(t, WithAttention(AttentionFA2)); !b.useFA2() || b.useOnePass() {
		t.Fatal("AttentionFA2 does not pick the FA2 kernels both ways")
	}
}

// TestEmuBackwardStrides runs the one-pass and the wgmma backward on q, k,
// v that are column slices of one packed (B, T, 3·H·D) projection and
// writes dq, dk, dv into slices of one packed gradient (the row strides of
// the fused projection), against the deterministic two-pass FA2 backward on
// the same inputs with contiguous outputs; the packed gradient starts as
// NaN, so an element left unwritten fails.
func TestEmuBackwardStrides(t *testing.T) {
	for _, impl := range []struct {
		name string
		opt  AttentionImpl
		run  backwardFunc
	}{{"onepass", AttentionFA2Atomic, (*Backend).attentionBackwardOnePass}, {"wg", AttentionWGMMA, (*Backend).attentionBackwardWG}} {
		for _, s := range [][4]int{{2, 200, 3, 64}, {1, 150, 2, 128}, {1, 1, 2, 64}} {
			t.Run(fmt.Sprintf("%s/%v", impl.name, s), func(t *testing.T) {
				testBackwardStrides(t, s, impl.opt, impl.run)
			})
		}
	}
}

// backwardFunc is an attention backward with explicit row strides.
type backwardFunc func(b *Backend, dq, dk, dv, dout, q, k, v, out, lse *tensor.Tensor, scale float32, nb, nt, nh, d, sqkv, so, sd int)

func testBackwardStrides(t *testing.T, s [4]int, opt AttentionImpl, run backwardFunc) {
	nb, nt, nh, d := s[0], s[1], s[2], s[3]
	hd := nh * d
	b := openEmu(t, WithAttention(opt))
	rng := testutil.Rng(uint64(nt + d))
	qkv := b.Zeros(tensor.BFloat16, nb, nt, 3*hd)
	b.Upload(qkv, testutil.Rand(rng, tensor.BFloat16, nb, nt, 3*hd))
	view := func(x *tensor.Tensor, part int) *tensor.Tensor {
		v, err := x.View(part*hd, nb, nt, nh, d)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	q, k, v := view(qkv, 0), view(qkv, 1), view(qkv, 2)
	scale := float32(1 / math.Sqrt(float64(d)))
	out, lse := b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.Float32, nb, nh, nt)
	b.attentionFA2(out, lse, q, k, v, scale, nb, nt, nh, d, 3*hd, hd)
	dout := b.Zeros(tensor.BFloat16, nb, nt, nh, d)
	b.Upload(dout, testutil.Rand(rng, tensor.BFloat16, nb, nt, nh, d))

	dqkv := b.Zeros(tensor.BFloat16, nb, nt, 3*hd)
	b.Fill(dqkv, math.NaN())
	run(b, view(dqkv, 0), view(dqkv, 1), view(dqkv, 2), dout, q, k, v, out, lse, scale, nb, nt, nh, d, 3*hd, hd, 3*hd)
	want := [3]*tensor.Tensor{b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.BFloat16, nb, nt, nh, d), b.Zeros(tensor.BFloat16, nb, nt, nh, d)}
	b.attentionBackwardFA2(want[0], want[1], want[2], dout, q, k, v, out, lse, scale, nb, nt, nh, d, 3*hd, hd, hd)
	got := values(t, b, dqkv)
	for part, name := range []string{"dq", "dk", "dv"} {
		w := values(t, b, want[part])
		g := make([]float64, len(w))
		for r := range nb * nt {
			copy(g[r*hd:(r+1)*hd], got[r*3*hd+part*hd:])
		}
		closeTo(t, name, g, w, 2e-3)
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
