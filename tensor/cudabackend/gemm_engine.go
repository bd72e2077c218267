package cudabackend

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// The GEMM engine: our own Hopper GEMM (cuda/kernels/gemm_sm90.cu), a
// persistent, warp-specialized TMA + wgmma kernel with bf16 inputs, fp32
// accumulation and a bf16 or fp32 output, built to take the hooks of the
// fused tensor-parallel kernels (a tile order, a wait on per-chunk flags
// before loading A, a signal per stored tile). MatMul uses it instead of
// cuBLASLt with WithGEMMEngine(GEMMAsyncTP); EngineMatMul calls it directly,
// with the hooks.
//
// Tensor maps (the TMA descriptors of A and B) are encoded per call:
// cuTensorMapEncodeTiled is a host function of the driver that packs
// address, sizes and strides into 128 bytes (no GPU call, no allocation),
// the map travels by value in the kernel's parameters, and a cache keyed by
// (pointer, shape, layout) would have to be invalidated whenever the caching
// allocator hands the same address out for another tensor.

// GEMM engines for WithGEMMEngine.
const (
	GEMMCublasLt = "cublaslt" // cuBLASLt (the default)
	GEMMAsyncTP  = "asynctp"  // the engine of cuda/kernels/gemm_sm90.cu, where it applies
)

// WithGEMMEngine picks MatMul's implementation: GEMMCublasLt (the default,
// until the engine is measured at least as fast) or GEMMAsyncTP. With
// GEMMAsyncTP, New fails unless the GPU can run the engine (sm_90, a driver
// with cuTensorMapEncodeTiled, an image with the engine's kernels), and
// MatMul takes the engine for every call it applies to (2-D bf16 operands,
// M, N, K multiples of 8, 16-byte aligned tensors; EngineSupports says why
// not), cuBLASLt for the others (f32, batched, odd sizes).
func WithGEMMEngine(name string) Option { return func(c *config) { c.gemm = name } }

// The engine's output tile: CTA tiles of EngineTileM rows and EngineTileN
// columns of C, the unit of its tile order and of GEMMSignal.
const (
	EngineTileM = 128
	EngineTileN = 256
)

const (
	engineThreads = 384
	// engineSmem is GEMM90_SMEM of gemm_sm90.cu: 1024 (alignment) + 4
	// stages of 48 KiB + the epilogue's staging (8 warps × 2 KiB) + 8
	// mbarriers + the abort word.
	engineSmem = 1024 + 4*48*1024 + 8*2048 + 8*8 + 16
	// engineSmemN192 is GEMM90_SMEM_N192, the …_n192 kernels': stages of
	// 40 KiB (tiles of 128 × 192).
	engineSmemN192 = 1024 + 4*40*1024 + 8*2048 + 8*8 + 16
	// engineTileN192 is the narrower tile of the …_n192 kernels (the
	// weight-gradient layout only, without hooks or the TMA store).
	engineTileN192 = 192
	// engineSmemTS is TS_SMEM_BYTES, the TMA-store kernels' (…_bf16_ts): 3
	// stages, the staging, the 64 KiB bf16 tile, 6 mbarriers, the abort word,
	// the 2 mbarriers of C's loads.
	engineSmemTS = 1024 + 3*48*1024 + 8*2048 + 64*1024 + 6*8 + 16 + 2*8
	// engineTMAStoreMaxK is the longest K for which EngineStoreAuto takes
	// the TMA-store kernels: their epilogue overlaps the next tile's main
	// loop, which matters where the main loop is short, and they have one
	// stage fewer, which matters where it is long.
	engineTMAStoreMaxK = 2048
	// engineGroupM is the default raster group: 8 m-blocks (1024 rows of
	// A) sweep all n-blocks before the next 8, so B's tiles are read from L2
	// by up to 8 CTAs.
	engineGroupM = 8
	// engineWatchdog bounds every wait of the kernel's pipeline: a phase
	// that never completes (a bug) traps the kernel instead of hanging the
	// GPU. The flag waits' own deadline comes on top.
	engineWatchdog = 10 * time.Second
)

// GEMMWait makes the engine's producer wait, before it loads the rows of A
// of a tile, until the 64-bit flag of every chunk of ChunkRows rows of
// op(A) that the tile touches is ≥ Target: flags[c] guards rows [c·ChunkRows,
// (c+1)·ChunkRows). Flags are read with ld.acquire.sys (written by the copy
// engine, cuStreamWriteValue64, or peers). A chunk still short after
// Timeout makes the kernel stop early (C is then undefined) and the next
// Sync fail with an error wrapping ErrGEMMWaitTimeout that names the chunk.
//
// While it waits (or signals, GEMMSignal) the engine leaves ReserveSMs SMs of the process's share
// free (its grid is that much smaller): what it waits for may need SMs — a
// device-to-device copy between processes on one GPU runs as a kernel, and
// a persistent grid on every SM would starve it until the deadline (as it
// did on an H200 shared by PEs under MPS). 0 is the default (EngineReserveSMs);
// a negative value reserves none.
type GEMMWait struct {
	Flags      uint64 // device address of the flags (uint64 each, 8-byte aligned)
	ChunkRows  int
	Target     uint64
	Timeout    time.Duration
	ReserveSMs int
}

// reserveOf is the SMs the engine (dense or grouped) leaves free while it
// waits or signals, for a process whose share of the GPU is avail SMs:
// asked when not 0 (a wait's ReserveSMs; negative: none), else
// $ASYNCTP_ENGINE_RESERVE_SMS, else EngineReserveSMs(avail).
func (b *Backend) reserveOf(avail, asked int) int {
	r := EngineReserveSMs(avail)
	if b.cfg.reserveSet {
		r = b.cfg.reserveSMs
	}
	if asked != 0 {
		r = asked
	}
	return max(r, 0)
}

// EngineReserveSMs is the default of GEMMWait.ReserveSMs for a process
// whose share of the GPU is sms SMs: max(8, sms/16), unless
// $ASYNCTP_ENGINE_RESERVE_SMS (an integer ≥ 0, read by New, which refuses
// anything else) says otherwise. The floor was 4; with four PEs under MPS
// (32 SMs each) the fused all-gather∘matmul's pulls then had too few SMs:
// its forward (8192 rows, K 4096) took 1576 µs with 8 against 2321 and
// 2385 µs with 4 in one call, and 8 cost nothing measurable at two PEs
// (66 SMs each; H200, docs/measurements/2026-12-02.md). (The stall seen
// at four PEs then was not the reserve: see peercopy's gatherLanded.)
func EngineReserveSMs(sms int) int { return max(8, sms/16) }

// parseReserve reads $ASYNCTP_ENGINE_RESERVE_SMS.
func parseReserve(v string) (int, error) {
	if v == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return -1, fmt.Errorf("cudabackend: ASYNCTP_ENGINE_RESERVE_SMS=%q: expected an integer ≥ 0 (the SMs the GEMM engine leaves free while it waits)", v)
	}
	return n, nil
}

// EngineSMs is the SMs the GEMM engine's persistent grid spans on this
// backend's GPU (its share under MPS) and where the figure came from; 0 and
// why not where the backend has no GPU.
func (b *Backend) EngineSMs() (int, string) {
	var n int
	from := "no GPU"
	b.do("EngineSMs", func(d gpu.Device) error {
		if cd, ok := d.(*cudaDevice); ok {
			n, from = cd.engineSMs, cd.engineSMsFrom
		}
		return nil
	})
	return n, from
}

// engineShare is the SMs the process may use, the engine's persistent grid
// (CTAs beyond it only run in a second wave, doubling the kernel's time),
// and where the figure came from: the context's SM limit as the driver
// reports it (ctxSMs, cuCtxGetExecAffinity), else the device's SM count
// sms. Under MPS the device attribute already reports the client's share
// (measured on the H200: 66 of 132 SMs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// =50), so the percentage must not be applied to it again — doing so ran
// the engine on a quarter of the GPU, at 0.47 of cuBLASLt.
func engineShare(sms int, ctxSMs func() (int, error)) (int, string) {
	if ctxSMs != nil {
		if n, err := ctxSMs(); err == nil && n > 0 && n <= sms {
			return n, "the context's SM limit (cuCtxGetExecAffinity)"
		}
	}
	return sms, "the device's SM count"
}

// GEMMSignal makes the engine add Value to a flag with a release (system
// scope) after each tile of C is stored: flags[mb·nBlocks + nb] per tile, or
// flags[mb] per 128-row block with PerRowBlock (it reaches nBlocks·Value
// when the block's row of tiles is done), where mb, nb are the tile's block
// indices (EngineTileM, EngineTileN) and nBlocks = ⌈N / EngineTileN⌉.
type GEMMSignal struct {
	Flags       uint64 // device address of the flags (uint64 each, 8-byte aligned)
	PerRowBlock bool
	Value       uint64
}

// GEMMOptions are the engine's hooks; the zero value is a plain GEMM.
type GEMMOptions struct {
	// GroupM is the raster group in m-blocks (0: the default 8; 1: tiles
	// row by row).
	GroupM int
	// RotateRows starts the tile order at the m-block holding this row of
	// C (a rank's own shard first); the m-blocks rotate, 0 ≤ RotateRows < M.
	RotateRows int
	Wait       *GEMMWait
	Signal     *GEMMSignal
	// Grid is the CTAs of the persistent grid (0: the process's SMs, less
	// the reserve of a call that waits or signals; capped at the tiles).
	// A tuning and measuring knob: a grid above the SMs the process really
	// has runs in two waves.
	Grid int
	// SplitK cuts the K range into this many slices, each a work unit of
	// its own whose fp32 product goes to a workspace, summed in a fixed
	// order by a second kernel (the same bits every run). 0: the engine
	// chooses (engineSplitK: only for outputs of fewer tiles than SMs with
	// a long K, e.g. weight gradients); 1: no split. Not with Wait or
	// Signal (their flags count tiles of C as they are stored).
	SplitK int
	// Store picks the epilogue: EngineStoreAuto (the TMA store for a bf16
	// C with no Signal and no split, where K ≤ 2048 or beta ≠ 0; else
	// staged), EngineStoreStaged or EngineStoreTMA (bf16 C only; a call it
	// does not suit — a Signal, split-K — stores staged in that kernel).
	// Both give the same bits.
	Store EngineStore
	// TileN is the tile's columns: 0 lets the engine choose (EngineTileN,
	// or 192 for the weight-gradient layout — transA, not transB — where
	// its wave model says so: outputs of a few tiles too many or too few
	// for the SMs), EngineTileN, or 192 (that layout only, without Wait,
	// Signal or Store = EngineStoreTMA). A different tile sums K in the
	// same order: the same bits.
	TileN int
}

// EngineStore is the engine's epilogue (GEMMOptions.Store).
type EngineStore int

const (
	// EngineStoreAuto lets the engine choose.
	EngineStoreAuto EngineStore = iota
	// EngineStoreStaged: the consumer warps store C through a small
	// shared-memory staging area themselves, then start the next tile (4
	// pipeline stages).
	EngineStoreStaged
	// EngineStoreTMA: the warps write the whole bf16 tile to shared memory
	// and one thread stores it with TMA while they start the next tile (3
	// pipeline stages; the …_bf16_ts kernels; with beta ≠ 0 the …_bf16_tsc
	// kernels, which load the tile of C there by TMA during the main loop).
	EngineStoreTMA
)

// engineMaxSplitK bounds GEMMOptions.SplitK (the workspace is SplitK × M ×
// N floats).
const engineMaxSplitK = 32

// engineSplitK is the engine's own choice of K slices for an output of
// tiles tiles of width × 256 columns and kblocks k-blocks of 64 on sms SMs,
// and its estimated time: the slice count S of least time, in units of one
// k-block of one 256-column tile (~0.8 µs on the H200; a k-block of a
// narrower tile costs width units), ceil(tiles·S / sms) waves of
// ⌈kblocks/S⌉·width + 3 (a tile's ramp and epilogue), plus, when split, the
// workspace (each tile-slice's fp32 product written and read back: ~0.09
// units at 3.5 TB/s, times width) and the reduction's launch (~5). 1 when
// nothing is won: enough tiles to fill the SMs, or too short a K for slices
// of ≥ 4 k-blocks.
func engineSplitK(tiles, kblocks, sms int, width float64) (int, float64) {
	best, bestT := 1, 0.0
	for s := 1; s <= engineMaxSplitK && kblocks >= 4*s; s++ {
		t := float64(ceilDiv(tiles*s, sms)) * (float64(ceilDiv(kblocks, s))*width + 3)
		if s > 1 {
			t += 0.09*float64(tiles*s)*width + 5
		}
		if s == 1 || t < bestT {
			best, bestT = s, t
		}
	}
	return best, bestT
}

// engineTileChoice is the engine's own choice between tiles of 256 and
// 192 columns for an (m, n) output of kblocks k-blocks on sms SMs, where
// both are possible: 192 (and its slices) when the wave model
// (engineSplitK) puts it at least 3 % ahead — the outputs whose tile
// count at 256 columns fits the SMs badly (gpt2's gate,up dW: 96 tiles of
// 256 on 132 SMs, 128 of 192).
func engineTileChoice(m, n, kblocks, sms int) (tileN, split int) {
	numM := ceilDiv(m, EngineTileM)
	s256, t256 := engineSplitK(numM*ceilDiv(n, EngineTileN), kblocks, sms, 1)
	s192, t192 := engineSplitK(numM*ceilDiv(n, engineTileN192), kblocks, sms, float64(engineTileN192)/EngineTileN)
	if t192 < 0.97*t256 {
		return engineTileN192, s192
	}
	return EngineTileN, s256
}

// ErrGEMMWaitTimeout is wrapped by the error of an engine call whose flag
// wait ran out (GEMMWait).
var ErrGEMMWaitTimeout = errors.New("the GEMM engine's flag wait timed out")

// engineState is what the backend learnt about running the engine, once.
type engineState struct {
	once sync.Once
	err  error // why the engine cannot run on this device (nil: it can)
}

// engineKernelProbe is a kernel every image with the engine has.
const engineKernelProbe = "gemm_sm90_nt_bf16"

// engineDevice reports whether d can run the engine, and why not.
func engineDevice(d gpu.Device) error {
	cd, ok := d.(*cudaDevice)
	if !ok {
		return fmt.Errorf("the GEMM engine needs a GPU (TMA, wgmma); %s is not one", d.Name())
	}
	dev, err := cuda.GetDevice(cd.ordinal)
	if err != nil {
		return err
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		return err
	}
	if major != 9 || minor != 0 {
		return fmt.Errorf("the GEMM engine needs an sm_90 GPU (Hopper: wgmma, TMA, setmaxnreg); %s is sm_%d%d", d.Name(), major, minor)
	}
	if !cuda.HasTensorMaps() {
		return fmt.Errorf("the GEMM engine needs cuTensorMapEncodeTiled, which this driver lacks (a driver of CUDA 12.0 or later; see $%s)", cuda.EnvLibCUDA)
	}
	if !d.HasKernel(engineKernelProbe) {
		return fmt.Errorf("the kernels image has no %s: rebuild it with cuda/kernels/build.sh", engineKernelProbe)
	}
	return nil
}

// EngineErr is why this backend cannot run the GEMM engine (no sm_90a
// GPU, no tensor maps in the driver, no engine kernels in the image), nil
// when it can. The fused strategies ask before they build a site.
func (b *Backend) EngineErr() error { return b.engineErr() }

// engineErr is why this backend cannot run the engine (nil: it can).
func (b *Backend) engineErr() error {
	b.eng.once.Do(func() {
		if err := b.dev.Acquire(); err != nil {
			b.eng.err = err
			return
		}
		defer b.dev.Release()
		b.eng.err = engineDevice(b.dev)
	})
	return b.eng.err
}

// engineCall is one checked call of the engine.
type engineCall struct {
	c, a, b        *tensor.Tensor
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	opt            GEMMOptions
}

// engineShape checks the operands of an engine call: a and b bf16, c bf16
// or f32, 2-D, shapes that agree, M, N, K positive multiples of 8, 16-byte
// aligned device tensors. The error says what was found and expected.
func engineShape(c, a, bm *tensor.Tensor, transA, transB bool) (m, n, k int, err error) {
	if a.DType() != tensor.BFloat16 || bm.DType() != tensor.BFloat16 {
		return 0, 0, 0, fmt.Errorf("a is %v and b is %v, expected bf16 operands", a.DType(), bm.DType())
	}
	if c.DType() != tensor.BFloat16 && c.DType() != tensor.Float32 {
		return 0, 0, 0, fmt.Errorf("c is %v, expected bf16 or f32", c.DType())
	}
	if len(a.Shape()) != 2 || len(bm.Shape()) != 2 || len(c.Shape()) != 2 {
		return 0, 0, 0, fmt.Errorf("a %v, b %v, c %v: expected 2-D tensors (the engine has no batch)", a.Shape(), bm.Shape(), c.Shape())
	}
	m, k = a.Dim(0), a.Dim(1)
	if transA {
		m, k = k, m
	}
	kb, n := bm.Dim(0), bm.Dim(1)
	if transB {
		kb, n = n, kb
	}
	if kb != k {
		return 0, 0, 0, fmt.Errorf("b has shape %v, expected inner dimension %d (transB %v) to match a %v (transA %v)", bm.Shape(), k, transB, a.Shape(), transA)
	}
	if c.Dim(0) != m || c.Dim(1) != n {
		return 0, 0, 0, fmt.Errorf("c has shape %v, expected %v for a %v and b %v", c.Shape(), tensor.Shape{m, n}, a.Shape(), bm.Shape())
	}
	for _, d := range []struct {
		name  string
		v     int
		rowed bool // a dimension that runs along 16-byte rows of a TMA-loaded operand
	}{{"M", m, transA}, {"N", n, true}, {"K", k, true}} {
		// M is only the outer (row) count of a K-major A, which TMA loads
		// with zero fill past M and the epilogue stores with a row guard:
		// any M > 0 there (the ragged row counts of the fused TP sites).
		if d.v <= 0 || (d.rowed && d.v%8 != 0) {
			return 0, 0, 0, fmt.Errorf("%s = %d, expected a positive multiple of 8 (16-byte rows for TMA)", d.name, d.v)
		}
		if d.v > 1<<30 {
			return 0, 0, 0, fmt.Errorf("%s = %d does not fit the engine's 32-bit indices", d.name, d.v)
		}
	}
	for _, t := range []struct {
		name string
		t    *tensor.Tensor
	}{{"a", a}, {"b", bm}, {"c", c}} {
		if p := DevicePtr(t.t); p%16 != 0 {
			return 0, 0, 0, fmt.Errorf("%s starts at %#x, expected a 16-byte aligned address (a view at element offset %d)", t.name, p, t.t.Offset())
		}
	}
	return m, n, k, nil
}

// checkOptions checks the hooks against the call's sizes.
func checkOptions(o GEMMOptions, m, k int, transA, transB bool) error {
	if o.GroupM < 0 {
		return fmt.Errorf("GroupM = %d, expected ≥ 0", o.GroupM)
	}
	if o.Grid < 0 {
		return fmt.Errorf("Grid = %d, expected ≥ 0 (0: the process's SMs)", o.Grid)
	}
	if o.RotateRows < 0 || o.RotateRows >= m {
		return fmt.Errorf("RotateRows = %d, expected 0 ≤ RotateRows < M = %d", o.RotateRows, m)
	}
	if w := o.Wait; w != nil {
		switch {
		case w.Flags == 0 || w.Flags%8 != 0:
			return fmt.Errorf("Wait.Flags = %#x, expected an 8-byte aligned device address", w.Flags)
		case w.ChunkRows <= 0:
			return fmt.Errorf("Wait.ChunkRows = %d, expected > 0", w.ChunkRows)
		case w.Timeout <= 0:
			return fmt.Errorf("Wait.Timeout = %v, expected > 0", w.Timeout)
		}
	}
	if s := o.Signal; s != nil && (s.Flags == 0 || s.Flags%8 != 0) {
		return fmt.Errorf("Signal.Flags = %#x, expected an 8-byte aligned device address", s.Flags)
	}
	if o.Store < EngineStoreAuto || o.Store > EngineStoreTMA {
		return fmt.Errorf("Store = %d, expected EngineStoreAuto, EngineStoreStaged or EngineStoreTMA", o.Store)
	}
	switch o.TileN {
	case 0, EngineTileN:
	case engineTileN192:
		if !transA || transB || o.Wait != nil || o.Signal != nil || o.Store == EngineStoreTMA {
			return fmt.Errorf("TileN = 192 with transA %v, transB %v, Wait %v, Signal %v, Store %d: expected the weight-gradient layout (transA, not transB) without hooks or the TMA store (the …_n192 kernels)",
				transA, transB, o.Wait != nil, o.Signal != nil, o.Store)
		}
	default:
		return fmt.Errorf("TileN = %d, expected 0 (the engine chooses), %d or %d", o.TileN, EngineTileN, engineTileN192)
	}
	switch kb := ceilDiv(k, 64); {
	case o.SplitK < 0 || o.SplitK > engineMaxSplitK:
		return fmt.Errorf("SplitK = %d, expected 0 (the engine chooses) to %d", o.SplitK, engineMaxSplitK)
	case o.SplitK > kb:
		return fmt.Errorf("SplitK = %d, expected at most the %d k-blocks of 64 in K = %d", o.SplitK, kb, k)
	case o.SplitK > 1 && (o.Wait != nil || o.Signal != nil):
		return fmt.Errorf("SplitK = %d with a Wait or Signal hook, expected 0 or 1 (the hooks count tiles of C as they are stored)", o.SplitK)
	}
	return nil
}

// EngineSupports returns nil if the engine can compute this call (with
// EngineMatMul, or under MatMul with WithGEMMEngine(GEMMAsyncTP)), else why
// not.
func (b *Backend) EngineSupports(c, a, bm *tensor.Tensor, transA, transB bool) error {
	if err := b.engineErr(); err != nil {
		return err
	}
	_, _, _, err := engineShape(c, a, bm, transA, transB)
	return err
}

// EngineMatMul computes C = alpha·op(A)·op(B) + beta·C with the engine, with
// MatMul's layouts (a (m, k), or (k, m) with transA; b (k, n), or (n, k)
// with transB; c (m, n)): bf16 a and b, fp32 accumulation, c bf16 or f32
// (beta = 0 does not read c). The forward y = x·Wᵀ is (false, true), the
// input gradient dx = dy·W (false, false) and the weight gradient dW += dyᵀ·x
// (true, false) with beta = 1. o holds the fused kernels' hooks.
//
// Like every op it queues the work and records an error for the next Sync
// (and returns it, nil when the call was queued); a flag wait that runs out
// (o.Wait) is found at the next Sync.
func (b *Backend) EngineMatMul(c, a, bm *tensor.Tensor, transA, transB bool, alpha, beta float32, o GEMMOptions) error {
	const op = "EngineMatMul"
	ck := b.check(op)
	ck.Own("a", a)
	ck.Own("b", bm)
	ck.Own("c", c)
	if !ck.OK() {
		return b.Err()
	}
	if err := b.engineErr(); err != nil {
		b.fail(fmt.Errorf("cuda: %s: %w", op, err))
		return b.Err()
	}
	m, n, k, err := engineShape(c, a, bm, transA, transB)
	if err == nil {
		err = checkOptions(o, m, k, transA, transB)
	}
	if err == nil && o.Store == EngineStoreTMA && c.DType() != tensor.BFloat16 {
		err = fmt.Errorf("Store = EngineStoreTMA with a %v c, expected bf16 (the TMA-store kernels write bf16)", c.DType())
	}
	if err != nil {
		b.fail(fmt.Errorf("cuda: %s: %w", op, err))
		return b.Err()
	}
	b.engineLaunch(op, engineCall{c: c, a: a, b: bm, transA: transA, transB: transB, m: m, n: n, k: k,
		alpha: alpha, beta: beta, opt: o})
	if b.failed() {
		return b.Err()
	}
	return nil
}

// engineKernel is the kernel of a layout and output dtype: gemm_sm90_<la><lb>_<out>,
// la = t for transA, lb = t for transB (MatMul's flags).
func engineKernel(transA, transB bool, out tensor.DType) string {
	l := func(t bool) string {
		if t {
			return "t"
		}
		return "n"
	}
	o := "bf16"
	if out == tensor.Float32 {
		o = "f32"
	}
	return "gemm_sm90_" + l(transA) + l(transB) + "_" + o
}

// operandMap is the tensor map of an operand stored (rows, cols) row-major
// at p. K-major operands (A without transA, B with transB) are read in
// boxes of (64 K, tileRows rows); MN-major ones in boxes of (64 MN, 64 K).
// The kernel's shared memory descriptors assume exactly these boxes and the
// 128-byte swizzle.
func operandMap(p uint64, rows, cols int, kMajor bool, tileRows int) (cuda.TensorMap, error) {
	box := []uint32{64, 64}
	if kMajor {
		box[1] = uint32(tileRows)
	}
	return cuda.EncodeTiled(cuda.TiledTensorMap{
		DType:   cuda.TensorMapBFloat16,
		Addr:    cuda.DevicePtr(p),
		Dims:    []uint64{uint64(cols), uint64(rows)},
		Strides: []uint64{uint64(cols) * 2},
		Box:     box,
		Swizzle: cuda.Swizzle128B,
		L2:      cuda.L2Promotion256B,
	})
}

// engineLaunch queues a checked call. op names it in errors.
func (b *Backend) engineLaunch(op string, e engineCall) {
	o := e.opt
	groupM := o.GroupM
	if groupM == 0 {
		groupM = engineGroupM
	}
	rot := o.RotateRows / EngineTileM
	var (
		waitFlags, sigFlags uint64
		waitRows            int32
		waitTarget, sigVal  uint64
		waitNs              int64
		sigMode             int32
	)
	watchdog := engineWatchdog
	if w := o.Wait; w != nil {
		waitFlags, waitRows, waitTarget, waitNs = w.Flags, int32(w.ChunkRows), w.Target, w.Timeout.Nanoseconds()
		// A tile waits on up to EngineTileM/ChunkRows + 2 chunks in turn.
		watchdog += time.Duration(EngineTileM/w.ChunkRows+2) * w.Timeout
	}
	if s := o.Signal; s != nil {
		sigFlags, sigVal = s.Flags, s.Value
		if s.PerRowBlock {
			sigMode = 1
		}
	}
	b.do(op, func(d gpu.Device) error {
		cd, ok := d.(*cudaDevice)
		if !ok {
			return fmt.Errorf("the GEMM engine needs a GPU; %s is not one", d.Name())
		}
		ar, ac := e.m, e.k // a stored (m, k), or (k, m) with transA
		if e.transA {
			ar, ac = e.k, e.m
		}
		br, bc := e.k, e.n // b stored (k, n), or (n, k) with transB
		if e.transB {
			br, bc = e.n, e.k
		}
		flag := b.flagPtr(flagGEMM, engineExplain(op, e, o.Wait))
		avail := cd.engineSMs
		if o.Wait != nil || o.Signal != nil {
			// A signalled tile is pulled by a copy that may need SMs too:
			// leaving some free lets it overlap the rest of the GEMM.
			asked := 0
			if o.Wait != nil {
				asked = o.Wait.ReserveSMs
			}
			avail -= b.reserveOf(avail, asked)
		}
		avail = max(avail, 1)
		tileN, split := e.tiling(avail)
		units := ceilDiv(e.m, EngineTileM) * ceilDiv(e.n, tileN) * split
		ma, err := operandMap(DevicePtr(e.a), ar, ac, !e.transA, EngineTileM)
		if err != nil {
			return fmt.Errorf("tensor map of a %v: %w", e.a.Shape(), err)
		}
		mb, err := operandMap(DevicePtr(e.b), br, bc, e.transB, tileN)
		if err != nil {
			return fmt.Errorf("tensor map of b %v: %w", e.b.Shape(), err)
		}
		grid := min(units, avail)
		if o.Grid > 0 {
			grid = min(units, o.Grid)
		}
		var partial gpu.Ptr
		if split > 1 {
			p, size, err := b.scratch(tensor.Float32, split*e.m*e.n)
			if err != nil {
				return err
			}
			defer b.putScratch(p, size) // after the reduction is queued: stream order
			partial = p
		}
		args := []any{ma.Arg(), mb.Arg()}
		kernel, smem := engineKernel(e.transA, e.transB, e.c.DType()), engineSmem
		if tileN == engineTileN192 {
			kernel, smem = kernel+"_n192", engineSmemN192
		} else if e.tmaStore(split) {
			mc, err := cuda.EncodeTiled(cuda.TiledTensorMap{
				DType:   cuda.TensorMapBFloat16,
				Addr:    cuda.DevicePtr(DevicePtr(e.c)),
				Dims:    []uint64{uint64(e.n), uint64(e.m)},
				Strides: []uint64{uint64(e.n) * 2},
				Box:     []uint32{64, 64}, // store_tile_tma's boxes
				Swizzle: cuda.Swizzle128B,
				L2:      cuda.L2Promotion256B,
			})
			if err != nil {
				return fmt.Errorf("tensor map of c %v: %w", e.c.Shape(), err)
			}
			args = append(args, mc.Arg())
			kernel, smem = kernel+"_ts", engineSmemTS
			if e.beta != 0 {
				kernel += "c" // …_tsc: C loaded by TMA during the main loop
			}
		}
		args = append(args, cuda.DevicePtr(DevicePtr(e.c)),
			int32(e.m), int32(e.n), int32(e.k), e.alpha, e.beta, int32(groupM), int32(rot),
			cuda.DevicePtr(waitFlags), waitRows, waitTarget, waitNs,
			cuda.DevicePtr(sigFlags), sigMode, sigVal, watchdog.Nanoseconds(), cuda.DevicePtr(flag),
			int32(split), cuda.DevicePtr(partial))
		if err := cd.launchRaw(kernel, grid, engineThreads, smem, args...); err != nil {
			return err
		}
		if split == 1 {
			return nil
		}
		n4 := e.m * e.n / 4 // N is a multiple of 8
		return d.Launch("gemm_splitk_reduce"+sfx(e.c.DType()), gpu.D1(min(ceilDiv(n4, threads256), 4*avail)),
			gpu.D1(threads256), 0, partial, int32(split), int64(n4), ptr(e.c), e.beta)
	})
}

// tiling is the call's tile columns and K slices on sms SMs: asked
// (GEMMOptions.TileN, SplitK), else the engine's choice — 256 columns and
// one slice with a hook (the hooks count tiles of C as they are stored);
// engineTileChoice where the …_n192 kernels apply (the weight-gradient
// layout, no TMA store asked); else engineSplitK.
func (e engineCall) tiling(sms int) (tileN, split int) {
	o := e.opt
	if o.Wait != nil || o.Signal != nil { // checkOptions refuses a split with them
		return EngineTileN, 1
	}
	kb := ceilDiv(e.k, 64)
	tileN = o.TileN
	if tileN == 0 && o.SplitK == 0 && e.transA && !e.transB && o.Store != EngineStoreTMA {
		return engineTileChoice(e.m, e.n, kb, sms)
	}
	if tileN == 0 {
		tileN = EngineTileN
	}
	if split = o.SplitK; split == 0 {
		split, _ = engineSplitK(ceilDiv(e.m, EngineTileM)*ceilDiv(e.n, tileN), kb, sms, float64(tileN)/EngineTileN)
	}
	return tileN, split
}

// tmaStore reports whether a call of split K slices runs on the TMA-store
// kernels (…_bf16_ts): asked (GEMMOptions.Store), or chosen
// (EngineStoreAuto) where the TMA store itself applies and K is short or
// C is read (beta ≠ 0).
func (e engineCall) tmaStore(split int) bool {
	switch s := e.opt.Store; {
	case e.c.DType() != tensor.BFloat16 || s == EngineStoreStaged:
		return false
	case s == EngineStoreTMA:
		return true
	}
	// With beta ≠ 0 the TMA-store kernels also load C during the main loop,
	// where the staged epilogue reads it while the tensor cores idle.
	return e.opt.Signal == nil && split == 1 && (e.beta != 0 || e.k <= engineTMAStoreMaxK)
}

// engineExplain turns the kernel's error word into the call's error: -1 is a
// kernel built without sm_90a code, c ≥ 0 the chunk whose flag wait ran out.
func engineExplain(op string, e engineCall, w *GEMMWait) func(bad int32) error {
	return func(bad int32) error {
		if bad == -1 || w == nil {
			return fmt.Errorf("cuda: %s (%dx%dx%d): the GEMM engine's kernel has no sm_90a code for this GPU (the image's compute_90 PTX was used): rebuild the image with -gencode arch=compute_90a,code=sm_90a (cuda/kernels/build.sh)",
				op, e.m, e.n, e.k)
		}
		lo := int(bad) * w.ChunkRows
		return fmt.Errorf("cuda: %s (%dx%dx%d): chunk %d (rows %d to %d of A) not ready: its flag stayed below %d for %v: %w",
			op, e.m, e.n, e.k, bad, lo, min(lo+w.ChunkRows, e.m)-1, w.Target, w.Timeout, ErrGEMMWaitTimeout)
	}
}

// launchRaw is Launch for kernels that take struct arguments by value
// (cuda.RawArg, e.g. a tensor map) and the other types of cuda.Launch.
func (d *cudaDevice) launchRaw(name string, grid, block, smem int, args ...any) error {
	f, err := d.function(name)
	if err != nil {
		return err
	}
	if smem > 48<<10 && d.smemSet[name] < smem {
		if err := f.SetMaxDynamicSharedMemory(smem); err != nil {
			return err
		}
		d.smemSet[name] = smem
	}
	return cuda.Launch(f, [3]uint32{uint32(grid), 1, 1}, [3]uint32{uint32(block), 1, 1}, uint32(smem), d.stream, args...)
}

// useEngine reports whether MatMul takes the engine for this call.
func (b *Backend) useEngine(c, a, bm *tensor.Tensor, transA, transB bool, batch int) bool {
	if b.cfg.gemm != GEMMAsyncTP || batch != 1 || len(a.Shape()) != 2 || a.DType() != tensor.BFloat16 {
		return false
	}
	if b.engineErr() != nil {
		return false
	}
	_, _, _, err := engineShape(c, a, bm, transA, transB)
	return err == nil
}

// checkGEMMEngine checks the WithGEMMEngine option at New.
func checkGEMMEngine(d gpu.Device, name string) error {
	switch name {
	case "", GEMMCublasLt:
		return nil
	case GEMMAsyncTP:
		if err := engineDevice(d); err != nil {
			return fmt.Errorf("WithGEMMEngine(%q): %w", name, err)
		}
		return nil
	}
	return fmt.Errorf("WithGEMMEngine(%q): unknown engine, expected %q or %q", name, GEMMCublasLt, GEMMAsyncTP)
}
