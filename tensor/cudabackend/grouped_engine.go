package cudabackend

import (
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
)

// The grouped expert GEMMs on the GEMM engine (cuda/kernels/grouped_sm90.cu):
// the tensor-core form of tensor.GroupedGEMM, one persistent TMA + wgmma
// launch for all the experts, the groups' offsets read by the kernel from
// device memory. GroupedMatMul and GroupedMatMulTN take it wherever it
// applies (groupedEngineFor says when) and the SIMT kernels of grouped.cu
// elsewhere; EngineGroupedMatMul and EngineGroupedMatMulTN call it directly,
// with an f32 output allowed (bf16 operands).

// EnvGrouped names the environment variable that picks the grouped GEMM's
// kernels at New: "simt" forces the SIMT kernels of grouped.cu (for
// comparisons; PreferGrouped then answers false unless WithGroupedGEMM(true)),
// "engine" or unset takes the engine where it applies.
const EnvGrouped = "ASYNCTP_GROUPED"

// Grouped GEMM kernels, the values of $ASYNCTP_GROUPED.
const (
	groupedKernelsEngine = "engine"
	groupedKernelsSIMT   = "simt"
)

// groupedChoice is the tri-state of WithGroupedGEMM.
type groupedChoice int

const (
	groupedAuto groupedChoice = iota // the default: grouped where the engine runs
	groupedOn                        // WithGroupedGEMM(true)
	groupedOff                       // WithGroupedGEMM(false)
)

const (
	// groupedEngineMaxGroups is MAX_GROUPS of grouped_sm90.cu: the groups
	// whose offsets and block prefix fit the kernel's shared-memory tables.
	groupedEngineMaxGroups = 1024
	// groupedEngineSmem is GROUPED90_SMEM: the engine's ring and barriers,
	// then the tables (two int32 per group + 1) and the bad-entry word.
	groupedEngineSmem = engineSmem + 2*(groupedEngineMaxGroups+1)*4 + 16
	// groupedEngineProbe is a kernel every image with the grouped engine has.
	groupedEngineProbe = "grouped_sm90_nt_bf16"
)

// groupedEngineState is what the backend learnt about running the grouped
// engine, once.
type groupedEngineState struct {
	once sync.Once
	err  error
}

// groupedEngineErr is why this backend cannot run the grouped engine (the
// engine's own reasons, an image without the grouped kernels, or
// $ASYNCTP_GROUPED=simt), nil when it can.
func (b *Backend) groupedEngineErr() error {
	if b.cfg.groupedSIMT {
		return fmt.Errorf("the grouped GEMM is forced to the SIMT kernels ($%s=%s)", EnvGrouped, groupedKernelsSIMT)
	}
	if err := b.engineErr(); err != nil {
		return err
	}
	b.geng.once.Do(func() {
		if err := b.dev.Acquire(); err != nil {
			b.geng.err = err
			return
		}
		defer b.dev.Release()
		if !b.dev.HasKernel(groupedEngineProbe) {
			b.geng.err = fmt.Errorf("the kernels image has no %s: rebuild it with cuda/kernels/build.sh", groupedEngineProbe)
		}
	})
	return b.geng.err
}

// groupedKernelsFromEnv reads $ASYNCTP_GROUPED: whether it forces the SIMT
// kernels.
func groupedKernelsFromEnv() (simt bool, err error) {
	switch v := os.Getenv(EnvGrouped); v {
	case "", groupedKernelsEngine:
		return false, nil
	case groupedKernelsSIMT:
		return true, nil
	default:
		return false, fmt.Errorf("$%s=%q: expected %q, %q or unset", EnvGrouped, v, groupedKernelsSIMT, groupedKernelsEngine)
	}
}

// groupedCall is one checked call of the grouped engine: the forward or
// dgrad (tn false: c (m, n) = a (m, k) · op(w[g]), w (g, n, k) with transW
// or (g, k, n)) or the wgrad (tn: c (g, n = P, k = Q) from a (m, P), b (m, Q)).
type groupedCall struct {
	c, a, b, offsets *tensor.Tensor
	tn, transW       bool
	g, m, n, k       int
	alpha, beta      float32
	opt              GroupedOptions // the fused expert path's hooks (forward and dgrad forms only)
}

// groupedEngineShape checks a forward or dgrad call for the engine: a (M, K)
// and w (G, N, K) with transW or (G, K, N) bf16, c (M, N) bf16 or f32,
// offsets (G+1) int32; M ≥ 1; N, K positive multiples of 8; 1 ≤ G ≤ 1024;
// a, w, c 16-byte aligned. The error says what was found and expected.
func groupedEngineShape(c, a, w, offsets *tensor.Tensor, transW bool) (g, m, n, k int, err error) {
	if a.DType() != tensor.BFloat16 || w.DType() != tensor.BFloat16 {
		return 0, 0, 0, 0, fmt.Errorf("a is %v and w is %v, expected bf16 operands", a.DType(), w.DType())
	}
	if c.DType() != tensor.BFloat16 && c.DType() != tensor.Float32 {
		return 0, 0, 0, 0, fmt.Errorf("c is %v, expected bf16 or f32", c.DType())
	}
	if len(a.Shape()) != 2 || len(w.Shape()) != 3 || len(c.Shape()) != 2 {
		return 0, 0, 0, 0, fmt.Errorf("a %v, w %v, c %v: expected a (M, K), w (G, N, K) or (G, K, N), c (M, N)", a.Shape(), w.Shape(), c.Shape())
	}
	m, k = a.Dim(0), a.Dim(1)
	g, kw, n := w.Dim(0), w.Dim(1), w.Dim(2)
	layout := "(G, K, N)"
	if transW {
		n, kw, layout = w.Dim(1), w.Dim(2), "(G, N, K)"
	}
	if kw != k {
		return 0, 0, 0, 0, fmt.Errorf("w has shape %v, expected %s with K = %d like a %v (transW %v)", w.Shape(), layout, k, a.Shape(), transW)
	}
	if c.Dim(0) != m || c.Dim(1) != n {
		return 0, 0, 0, 0, fmt.Errorf("c has shape %v, expected %v for a %v and w %v", c.Shape(), tensor.Shape{m, n}, a.Shape(), w.Shape())
	}
	if err := groupedEngineSizes(offsets, g, m, []sizeCheck{{"N", n}, {"K", k}}); err != nil {
		return 0, 0, 0, 0, err
	}
	// Tiles are numbered in int32: at most (⌊M/128⌋ + G) · ⌈N/256⌉.
	if t := (m/EngineTileM + g) * ceilDiv(n, EngineTileN); t > math.MaxInt32 {
		return 0, 0, 0, 0, fmt.Errorf("up to %d tiles of %dx%d for M = %d, N = %d, G = %d: expected at most 2^31 - 1", t, EngineTileM, EngineTileN, m, n, g)
	}
	if err := engineAligned(tensorNamed{"a", a}, tensorNamed{"w", w}, tensorNamed{"c", c}); err != nil {
		return 0, 0, 0, 0, err
	}
	return g, m, n, k, nil
}

// groupedEngineShapeTN checks a wgrad call for the engine: a (M, P) and
// b (M, Q) bf16, c (G, P, Q) bf16 or f32, offsets (G+1) int32; M ≥ 1; P, Q
// positive multiples of 8; 1 ≤ G ≤ 1024; a, b, c 16-byte aligned.
func groupedEngineShapeTN(c, a, bm, offsets *tensor.Tensor) (g, m, p, q int, err error) {
	if a.DType() != tensor.BFloat16 || bm.DType() != tensor.BFloat16 {
		return 0, 0, 0, 0, fmt.Errorf("a is %v and b is %v, expected bf16 operands", a.DType(), bm.DType())
	}
	if c.DType() != tensor.BFloat16 && c.DType() != tensor.Float32 {
		return 0, 0, 0, 0, fmt.Errorf("c is %v, expected bf16 or f32", c.DType())
	}
	if len(a.Shape()) != 2 || len(bm.Shape()) != 2 || len(c.Shape()) != 3 {
		return 0, 0, 0, 0, fmt.Errorf("a %v, b %v, c %v: expected a (M, P), b (M, Q), c (G, P, Q)", a.Shape(), bm.Shape(), c.Shape())
	}
	m, p, q, g = a.Dim(0), a.Dim(1), bm.Dim(1), c.Dim(0)
	if bm.Dim(0) != m {
		return 0, 0, 0, 0, fmt.Errorf("b has shape %v, expected %d rows like a %v", bm.Shape(), m, a.Shape())
	}
	if c.Dim(1) != p || c.Dim(2) != q {
		return 0, 0, 0, 0, fmt.Errorf("c has shape %v, expected %v for a %v and b %v", c.Shape(), tensor.Shape{g, p, q}, a.Shape(), bm.Shape())
	}
	if err := groupedEngineSizes(offsets, g, m, []sizeCheck{{"P", p}, {"Q", q}}); err != nil {
		return 0, 0, 0, 0, err
	}
	if t := g * ceilDiv(p, EngineTileM) * ceilDiv(q, EngineTileN); t > math.MaxInt32 {
		return 0, 0, 0, 0, fmt.Errorf("%d tiles of %dx%d for G = %d, P = %d, Q = %d: expected at most 2^31 - 1", t, EngineTileM, EngineTileN, g, p, q)
	}
	if err := engineAligned(tensorNamed{"a", a}, tensorNamed{"b", bm}, tensorNamed{"c", c}); err != nil {
		return 0, 0, 0, 0, err
	}
	return g, m, p, q, nil
}

type sizeCheck struct {
	name string
	v    int
}

// groupedEngineSizes checks what both grouped engine calls need: offsets
// (G+1) int32, 1 ≤ G ≤ 1024, 1 ≤ M < 2^31, the widths positive multiples of
// 8 (16-byte rows for TMA) that fit int32.
func groupedEngineSizes(offsets *tensor.Tensor, g, m int, widths []sizeCheck) error {
	if offsets.DType() != tensor.Int32 || len(offsets.Shape()) != 1 || offsets.Dim(0) != g+1 {
		return fmt.Errorf("offsets is %v %v, expected (G + 1) = (%d) int32 for G = %d groups", offsets.DType(), offsets.Shape(), g+1, g)
	}
	if g < 1 || g > groupedEngineMaxGroups {
		return fmt.Errorf("G = %d groups, expected 1 to %d (the kernel's shared-memory tables)", g, groupedEngineMaxGroups)
	}
	if m < 1 || m > math.MaxInt32 {
		return fmt.Errorf("M = %d rows, expected 1 to 2^31 - 1", m)
	}
	for _, d := range widths {
		if d.v <= 0 || d.v%8 != 0 {
			return fmt.Errorf("%s = %d, expected a positive multiple of 8 (16-byte rows for TMA)", d.name, d.v)
		}
		if d.v > 1<<30 {
			return fmt.Errorf("%s = %d does not fit the engine's 32-bit indices", d.name, d.v)
		}
	}
	return nil
}

type tensorNamed struct {
	name string
	t    *tensor.Tensor
}

// engineAligned checks that device tensors start 16-byte aligned (TMA's base
// addresses, the epilogue's paired stores).
func engineAligned(ts ...tensorNamed) error {
	for _, t := range ts {
		if p := DevicePtr(t.t); p%16 != 0 {
			return fmt.Errorf("%s starts at %#x, expected a 16-byte aligned address (a view at element offset %d)", t.name, p, t.t.Offset())
		}
	}
	return nil
}

// groupedEngineFor returns nil when GroupedMatMul (tn false) or
// GroupedMatMulTN (tn) takes the engine for this call, else why not. The
// operands have passed the op's own checks.
func (b *Backend) groupedEngineFor(c, a, w, offsets *tensor.Tensor, tn, transW bool) error {
	if err := b.groupedEngineErr(); err != nil {
		return err
	}
	var err error
	if tn {
		_, _, _, _, err = groupedEngineShapeTN(c, a, w, offsets)
	} else {
		_, _, _, _, err = groupedEngineShape(c, a, w, offsets, transW)
	}
	return err
}

// EngineGroupedMatMul is GroupedMatMul (see tensor.GroupedGEMM) on the
// engine: c[R_g] = alpha·a[R_g]·op(w[g]) + beta·c[R_g] for a (M, K) bf16, w
// (G, N, K) bf16 with transW (the forward x·W_eᵀ) or (G, K, N) without (the
// input gradient dy·W_e), c (M, N) bf16 or f32, offsets (G+1) int32 on the
// device. It fails (the backend's sticky error) where the engine cannot run
// or the call does not fit it (groupedEngineShape); bad offsets are reported
// at the next Sync and nothing is written.
func (b *Backend) EngineGroupedMatMul(c, a, w, offsets *tensor.Tensor, transW bool, alpha, beta float32) error {
	return b.engineGrouped("EngineGroupedMatMul", c, a, w, "w", offsets, func() (groupedCall, error) {
		g, m, n, k, err := groupedEngineShape(c, a, w, offsets, transW)
		return groupedCall{c: c, a: a, b: w, offsets: offsets, transW: transW, g: g, m: m, n: n, k: k, alpha: alpha, beta: beta}, err
	})
}

// EngineGroupedMatMulTN is GroupedMatMulTN on the engine: c[g] =
// alpha·a[R_g]ᵀ·b[R_g] + beta·c[g] for a (M, P), b (M, Q) bf16, c (G, P, Q)
// bf16 or f32 (the weight gradients of the experts, into bf16 or f32
// accumulators). Errors as EngineGroupedMatMul.
func (b *Backend) EngineGroupedMatMulTN(c, a, bm, offsets *tensor.Tensor, alpha, beta float32) error {
	return b.engineGrouped("EngineGroupedMatMulTN", c, a, bm, "b", offsets, func() (groupedCall, error) {
		g, m, p, q, err := groupedEngineShapeTN(c, a, bm, offsets)
		return groupedCall{c: c, a: a, b: bm, offsets: offsets, tn: true, g: g, m: m, n: p, k: q, alpha: alpha, beta: beta}, err
	})
}

// engineGrouped checks and launches one direct call of the grouped engine:
// the operands on this backend (bm named bName), the engine here, the call's shape (shape,
// which also builds it); a failure is the backend's sticky error.
func (b *Backend) engineGrouped(op string, c, a, bm *tensor.Tensor, bName string, offsets *tensor.Tensor, shape func() (groupedCall, error)) error {
	ck := b.check(op)
	ck.Own("a", a)
	ck.Own(bName, bm)
	ck.Own("c", c)
	ck.Own("offsets", offsets)
	if !ck.OK() {
		return b.Err()
	}
	if err := b.groupedEngineErr(); err != nil {
		b.fail(fmt.Errorf("cuda: %s: %w", op, err))
		return b.Err()
	}
	call, err := shape()
	if err != nil {
		b.fail(fmt.Errorf("cuda: %s: %w", op, err))
		return b.Err()
	}
	b.groupedLaunch(op, call)
	return b.Err()
}

// groupedKernel is the kernel of a call: grouped_sm90_{nt,nn,tn}_<out>.
func groupedKernel(tn, transW bool, out tensor.DType) string {
	l := "nn"
	switch {
	case tn:
		l = "tn"
	case transW:
		l = "nt"
	}
	o := "bf16"
	if out == tensor.Float32 {
		o = "f32"
	}
	return "grouped_sm90_" + l + "_" + o
}

// weightMap is the 3-D tensor map of the experts' weights w, innermost
// first: (K, N, G) for w (G, N, K) (K-major, boxes (64 K, 256 N, 1)) or (N,
// K, G) for w (G, K, N) (MN-major, boxes (64 N, 64 K, 1)). A box never
// crosses into the next expert: what lies past N or K reads as zeros.
func weightMap(p uint64, g, n, k int, transW bool) (cuda.TensorMap, error) {
	inner, outer := k, n // w (G, N, K)
	box := []uint32{64, EngineTileN, 1}
	if !transW { // w (G, K, N)
		inner, outer = n, k
		box = []uint32{64, 64, 1}
	}
	return cuda.EncodeTiled(cuda.TiledTensorMap{
		DType:   cuda.TensorMapBFloat16,
		Addr:    cuda.DevicePtr(p),
		Dims:    []uint64{uint64(inner), uint64(outer), uint64(g)},
		Strides: []uint64{uint64(inner) * 2, uint64(inner) * uint64(outer) * 2},
		Box:     box,
		Swizzle: cuda.Swizzle128B,
		L2:      cuda.L2Promotion256B,
	})
}

// groupedExplain turns the grouped engine's error word into the call's
// error: -1 is a kernel without sm_90a code, i ≥ 0 the first bad entry of
// the offsets.
func groupedExplain(op string, g, m int, w *GroupedWait) func(bad int32) error {
	offsets := badOffsets(op, g, m)
	return func(bad int32) error {
		if w != nil && bad >= groupedWaitCode {
			return fmt.Errorf("cuda: %s: block %d of a's 128-row blocks (group-major: the blocks of group 0, then 1, …) not ready: its flag stayed below %d for %v: %w",
				op, bad-groupedWaitCode, w.Target, w.Timeout, ErrGEMMWaitTimeout)
		}
		if bad == -1 {
			return fmt.Errorf("cuda: %s: the grouped GEMM engine's kernel has no sm_90a code for this GPU (the image's compute_90 PTX was used): rebuild the image with -gencode arch=compute_90a,code=sm_90a (cuda/kernels/build.sh)", op)
		}
		return offsets(bad)
	}
}

// groupedWaitCode is added to the block of a flag wait that ran out in the
// grouped kernels' error word (bad offsets entries are below it).
const groupedWaitCode = 0x40000000

// groupedLaunch queues a checked call of the grouped engine. op names it in
// errors.
func (b *Backend) groupedLaunch(op string, e groupedCall) {
	b.do(op, func(d gpu.Device) error {
		cd, ok := d.(*cudaDevice)
		if !ok {
			return fmt.Errorf("the grouped GEMM engine needs a GPU; %s is not one", d.Name())
		}
		var ma, mb cuda.TensorMap
		var err error
		var tiles int
		if e.tn { // a (m, P), b (m, Q): MN-major, boxes (64, 64)
			if ma, err = operandMap(DevicePtr(e.a), e.m, e.n, false, EngineTileM); err != nil {
				return fmt.Errorf("tensor map of a %v: %w", e.a.Shape(), err)
			}
			if mb, err = operandMap(DevicePtr(e.b), e.m, e.k, false, EngineTileN); err != nil {
				return fmt.Errorf("tensor map of b %v: %w", e.b.Shape(), err)
			}
			tiles = e.g * ceilDiv(e.n, EngineTileM) * ceilDiv(e.k, EngineTileN)
		} else { // a (m, k) K-major, boxes (64 K, 128 rows); w per expert
			if ma, err = operandMap(DevicePtr(e.a), e.m, e.k, true, EngineTileM); err != nil {
				return fmt.Errorf("tensor map of a %v: %w", e.a.Shape(), err)
			}
			if mb, err = weightMap(DevicePtr(e.b), e.g, e.n, e.k, e.transW); err != nil {
				return fmt.Errorf("tensor map of w %v: %w", e.b.Shape(), err)
			}
			// Σ_g ⌈rows_g / 128⌉ ≤ ⌊M / 128⌋ + G row blocks; CTAs past the
			// real count (known on the device only) find no tile.
			tiles = (e.m/EngineTileM + e.g) * ceilDiv(e.n, EngineTileN)
		}
		flag := b.flagPtr(flagGrouped, groupedExplain(op, e.g, e.m, e.opt.Wait))
		avail := cd.engineSMs
		o := e.opt
		if o.Wait != nil || o.Signal != nil {
			// What the hooks wait for, or what waits on their signals (the
			// fused path's side stream), needs SMs: GEMMWait's rule.
			asked := 0
			if o.Wait != nil {
				asked = o.Wait.ReserveSMs
			}
			avail -= b.reserveOf(avail, asked)
		}
		grid := max(min(tiles, avail), 1)
		if e.tn {
			return cd.launchRaw(groupedKernel(e.tn, e.transW, e.c.DType()), grid, engineThreads, groupedEngineSmem,
				ma.Arg(), mb.Arg(), cuda.DevicePtr(DevicePtr(e.c)), cuda.DevicePtr(DevicePtr(e.offsets)),
				int32(e.g), int32(e.m), int32(e.n), int32(e.k), e.alpha, e.beta, int32(engineGroupM),
				engineWatchdog.Nanoseconds(), cuda.DevicePtr(flag))
		}
		var (
			waitFlags, sigFlags, waitTarget, sigVal uint64
			waitNs                                  int64
		)
		watchdog := engineWatchdog
		if w := o.Wait; w != nil {
			waitFlags, waitTarget, waitNs = w.Flags, w.Target, w.Timeout.Nanoseconds()
			watchdog += w.Timeout
		}
		if s := o.Signal; s != nil {
			sigFlags, sigVal = s.Flags, s.Value
		}
		return cd.launchRaw(groupedKernel(e.tn, e.transW, e.c.DType()), grid, engineThreads, groupedEngineSmem,
			ma.Arg(), mb.Arg(), cuda.DevicePtr(DevicePtr(e.c)), cuda.DevicePtr(DevicePtr(e.offsets)),
			int32(e.g), int32(e.m), int32(e.n), int32(e.k), e.alpha, e.beta, int32(engineGroupM),
			watchdog.Nanoseconds(), cuda.DevicePtr(flag), cuda.DevicePtr(waitFlags), waitTarget, waitNs,
			cuda.DevicePtr(sigFlags), sigVal)
	})
}

// GroupedWait makes the grouped engine's producer (forward and dgrad
// forms) wait, before it loads the rows of a tile's 128-row block q (the
// group-major block order: the blocks of group 0, then group 1, …), until
// the 64-bit flag Flags[q] is ≥ Target (ld.acquire.sys), each for at most
// Timeout; a block still short makes the kernel stop early (c is then
// undefined) and the next Sync fail with an error wrapping
// ErrGEMMWaitTimeout that names the block. ReserveSMs as in GEMMWait.
// The tile order stays static (group by group, the engine's raster inside
// a group): the dispatch lands each source's rows of every expert, so no
// block order is cheaply known to arrive first.
type GroupedWait struct {
	Flags      uint64
	Target     uint64
	Timeout    time.Duration
	ReserveSMs int
}

// GroupedSignal makes the grouped engine's epilogue (forward and dgrad
// forms) add Value to Flags[q] (red.release.sys) after each tile of block q
// is stored: it reaches ⌈N / 256⌉·Value when the block is done.
type GroupedSignal struct {
	Flags uint64
	Value uint64
}

// GroupedOptions are the grouped engine's hooks; the zero value is a plain
// grouped GEMM.
type GroupedOptions struct {
	Wait   *GroupedWait
	Signal *GroupedSignal
}

func (o GroupedOptions) check() error {
	if w := o.Wait; w != nil {
		if w.Flags == 0 || w.Flags%8 != 0 {
			return fmt.Errorf("Wait.Flags = %#x, expected an 8-byte aligned device address", w.Flags)
		}
		if w.Timeout <= 0 {
			return fmt.Errorf("Wait.Timeout = %v, expected > 0", w.Timeout)
		}
	}
	if s := o.Signal; s != nil && (s.Flags == 0 || s.Flags%8 != 0) {
		return fmt.Errorf("Signal.Flags = %#x, expected an 8-byte aligned device address", s.Flags)
	}
	return nil
}

// EngineGroupedMatMulHooked is EngineGroupedMatMul with the fused path's
// hooks (o): the producer's wait per 128-row block of a and the epilogue's
// signal per 128-row block of c.
func (b *Backend) EngineGroupedMatMulHooked(c, a, w, offsets *tensor.Tensor, transW bool, alpha, beta float32, o GroupedOptions) error {
	const op = "EngineGroupedMatMulHooked"
	if err := o.check(); err != nil {
		b.fail(fmt.Errorf("cuda: %s: %w", op, err))
		return b.Err()
	}
	return b.engineGrouped(op, c, a, w, "w", offsets, func() (groupedCall, error) {
		g, m, n, k, err := groupedEngineShape(c, a, w, offsets, transW)
		return groupedCall{c: c, a: a, b: w, offsets: offsets, transW: transW, g: g, m: m, n: n, k: k, alpha: alpha, beta: beta, opt: o}, err
	})
}

// EngineGroupedSupports returns nil if EngineGroupedMatMul can compute this
// call, else why not.
func (b *Backend) EngineGroupedSupports(c, a, w, offsets *tensor.Tensor, transW bool) error {
	return b.groupedEngineFor(c, a, w, offsets, false, transW)
}

// GroupedEngineErr is why this backend cannot run the grouped engine (nil
// when it can).
func (b *Backend) GroupedEngineErr() error { return b.groupedEngineErr() }
