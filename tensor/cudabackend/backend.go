package cudabackend

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/asynctp/asynctp/cuda"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend/internal/gpu"
	"github.com/asynctp/asynctp/tensor/opcheck"
)

// Backend is tensor.Backend on one GPU. Create it with New; Close it when
// done. Its methods may be called from any goroutine (they are serialised);
// see the package documentation for threads, errors and dtypes.
type Backend struct {
	mu      sync.Mutex // serialises ops: they share one stream
	dev     gpu.Device
	index   int
	cfg     config
	closed  bool
	alloc   *allocator
	flags   gpu.Ptr       // device int32 pairs, one per flagSlot (see common.cuh: err)
	pending []pendingFlag // launches whose data checks are not read back yet
	rope    map[ropeKey]gpu.Ptr
	hasFA2  bool               // the image has the tensor-core attention kernels (attention_fa2.cu)
	hasWG   bool               // and the wgmma backward runs here (attention_wg.cu)
	pol     opcheck.Policy     // what its ops accept, with the shared checks (check.go)
	fork    *cuda.Event        // StreamWait's event, re-recorded by each call (streams.go)
	eng     engineState        // whether the GEMM engine runs here (gemm_engine.go)
	geng    groupedEngineState // whether its grouped kernels do (grouped_engine.go)
	phases  *PhaseTimes        // the running phase timer (phases.go), nil when none

	errMu sync.Mutex
	err   error
	fatal bool // err came from the CUDA driver (or a closed backend): ClearErr refuses
}

var (
	_ tensor.Backend    = (*Backend)(nil)
	_ tensor.ErrClearer = (*Backend)(nil)
)

type config struct {
	kernels   string // image path; "" = FindKernels
	attention AttentionImpl
	grouped   groupedChoice // whether layers take the grouped GEMM (WithGroupedGEMM)
	gemm      string        // MatMul's engine (WithGEMMEngine)
	// groupedSIMT forces the grouped GEMMs onto the SIMT kernels of
	// grouped.cu ($ASYNCTP_GROUPED=simt; tests set it to compare).
	groupedSIMT bool
	ledger      bool // WithMemLedger
	// reserveSMs is $ASYNCTP_ENGINE_RESERVE_SMS when reserveSet: the SMs
	// the engine leaves free while it waits (else EngineReserveSMs).
	reserveSMs int
	reserveSet bool
}

// Option configures New.
type Option func(*config)

// WithGroupedGEMM sets whether the MoE layers take this backend's grouped
// GEMM (one launch for all experts, offsets on the device: the pipelined
// expert path's step without host reads) or one cuBLASLt GEMM per expert
// (PreferGrouped, PreferGroupedFor). Without it, a layer takes the grouped
// GEMM when it has at least GroupedAutoMinExperts local experts and the
// grouped engine runs here, else one GEMM per expert (the measurements are
// at GroupedAutoMinExperts). WithGroupedGEMM(true) takes the grouped GEMM
// for every layer, WithGroupedGEMM(false) one GEMM per expert. The
// ops themselves work either way (tensor.GroupedGEMM), each call on the
// tensor-core engine (grouped_sm90.cu) where it applies (an sm_90a GPU,
// bf16, N and K multiples of 8, 16-byte aligned tensors, at most 1024
// groups, $ASYNCTP_GROUPED not "simt") and on the SIMT kernels of
// grouped.cu elsewhere.
func WithGroupedGEMM(on bool) Option {
	return func(c *config) {
		c.grouped = groupedOff
		if on {
			c.grouped = groupedOn
		}
	}
}

// PreferGrouped implements tensor.GroupedPreference (see WithGroupedGEMM):
// without a count of experts, only WithGroupedGEMM(true) prefers it.
func (b *Backend) PreferGrouped() bool {
	switch b.cfg.grouped {
	case groupedOn:
		return true
	}
	return false // see WithGroupedGEMM: slower than per-expert cuBLASLt with a few large experts
}

// GroupedAutoMinExperts is the fewest local experts for which a layer
// takes the grouped GEMM when WithGroupedGEMM is not given
// (PreferGroupedFor). Measured on an H200 (BENCHMARKS.md, "MoE layer";
// one MoE layer forward + backward, EP 2 under MPS, 4096
// tokens per rank, the pipelined path): with 4 local experts (top-2 of 8,
// hidden 2048 and 4096) one cuBLASLt GEMM per expert on host counts is 4 %
// and 24 % faster than the grouped engine's device step; with 32 (top-8 of
// 64) the grouped device step is 16 % and 11 % faster; at 8 local experts
// (top-2 of 16) the two tie and at 16 (top-4 of 32) grouped is 11 % faster,
// so 16 is where the measurement turns.
const GroupedAutoMinExperts = 16

// PreferGroupedFor implements tensor.GroupedCountPreference: a layer of
// groups local experts takes the grouped GEMM with WithGroupedGEMM(true),
// never with WithGroupedGEMM(false), and by default when it has at least
// GroupedAutoMinExperts and the grouped engine runs here (an sm_90a GPU).
func (b *Backend) PreferGroupedFor(groups int) bool {
	switch b.cfg.grouped {
	case groupedOn:
		return true
	case groupedOff:
		return false
	}
	return groups >= GroupedAutoMinExperts && b.groupedEngineErr() == nil
}

// WithKernels loads the kernels image from path instead of looking for it
// (see FindKernels).
func WithKernels(path string) Option { return func(c *config) { c.kernels = path } }

// AttentionImpl picks the attention kernels.
type AttentionImpl int

const (
	// AttentionAuto uses the fastest deterministic tensor-core kernels
	// that run here (bf16, head dim 64 or 128: attention_wg.cu's on an
	// sm_90 GPU, AttentionWGMMA; attention_fa2.cu's elsewhere,
	// AttentionFA2) where they apply and the CUDA-core kernels elsewhere.
	AttentionAuto AttentionImpl = iota
	// AttentionSIMT always uses the CUDA-core kernels (any head dim ≤ 128,
	// bf16 and f32): slower, simplest, the reference for the others.
	AttentionSIMT
)

// WithAttention picks the attention kernels (default AttentionAuto).
func WithAttention(a AttentionImpl) Option { return func(c *config) { c.attention = a } }

// New opens GPU number device (0-based): it binds the device's primary
// context, creates a stream and a cuBLASLt handle, and loads the kernels
// image. It fails with a clear error when there is no driver, no such GPU,
// or no image. New leaves the calling goroutine as it found it: every op
// locks its goroutine to the OS thread and makes the context current only
// for its own duration.
func New(device int, opts ...Option) (*Backend, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	simt, err := groupedKernelsFromEnv()
	if err != nil {
		return nil, fmt.Errorf("cudabackend: %w", err)
	}
	cfg.groupedSIMT = cfg.groupedSIMT || simt
	if cfg.reserveSMs, err = parseReserve(os.Getenv("ASYNCTP_ENGINE_RESERVE_SMS")); err != nil {
		return nil, err
	}
	cfg.reserveSet = cfg.reserveSMs >= 0
	if err := cuda.Init(); err != nil { // no driver or no GPU: say so first
		return nil, fmt.Errorf("cudabackend: %w", err)
	}
	path := cfg.kernels
	if path == "" {
		var err error
		if path, err = FindKernels(); err != nil {
			return nil, err
		}
	}
	d, err := openCUDA(device, path)
	if err != nil {
		return nil, fmt.Errorf("cudabackend: opening cuda:%d: %w", device, err)
	}
	return newBackend(d, device, cfg)
}

// newBackend builds a backend on an opened device (the GPU, or the emulator
// in tests).
func newBackend(d gpu.Device, index int, cfg config) (*Backend, error) {
	b := &Backend{dev: d, index: index, cfg: cfg, rope: make(map[ropeKey]gpu.Ptr)}
	b.pol = b.policy()
	b.alloc = newAllocator(d, cfg.ledger)
	if err := d.Acquire(); err != nil {
		return nil, err
	}
	defer d.Release()
	if err := checkGEMMEngine(d, cfg.gemm); err != nil {
		d.Close()
		return nil, fmt.Errorf("cudabackend: %s: %w", d.Name(), err)
	}
	p, err := d.Alloc(flagBytes)
	if err == nil {
		err = d.Memset8(p, 0, flagBytes)
	}
	if err == nil {
		err = d.Sync()
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("cudabackend: %s: %w", d.Name(), err)
	}
	b.flags = p
	b.hasFA2 = d.HasKernel(fa2KernelProbe)
	b.hasWG = wgDevice(d)
	return b, nil
}

// Name returns "cuda".
func (b *Backend) Name() string { return "cuda" }

// Device returns cuda:<index>.
func (b *Backend) Device() tensor.Device { return tensor.Device{Kind: tensor.CUDA, Index: b.index} }

// DeviceName names the GPU, e.g. "cuda:0 (NVIDIA H200)".
func (b *Backend) DeviceName() string { return b.dev.Name() }

// Stream returns the CUDA stream on which the backend queues every op: the
// stream to hand a GPU transport (comm.Stream, e.g. parallel/model's
// Options.Stream), so that collectives are ordered with the ops on the
// device instead of on the host. It is a *cuda.Stream, which comm/nccl takes
// as is and comm/nvshmem through its Handle; it stays the backend's (do not
// Destroy it) and is valid until Close. On the kernel emulator, which has no
// CUDA stream, it is nil. See the package documentation ("Streams and
// collectives") for the contract.
func (b *Backend) Stream() *cuda.Stream {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d, ok := b.dev.(*cudaDevice); ok && !b.closed {
		return d.stream
	}
	return nil
}

// StreamHandle is the CUstream (also a cudaStream_t) of Stream, for code
// that takes a raw handle; 0 on the emulator and after Close.
func (b *Backend) StreamHandle() uintptr {
	if s := b.Stream(); s != nil {
		return s.Handle()
	}
	return 0
}

// Err returns the first error recorded by an op, or nil. It does not wait
// for the GPU: errors found by kernels in the data (an id outside the
// table, a target ≥ V) are read back at the next Sync, Download or
// SumSquares. Errors found in the arguments (shapes, dtypes) are recorded at
// once.
func (b *Backend) Err() error {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	return b.err
}

// Sync waits for all queued work, reads back the kernels' data checks, and
// returns Err().
func (b *Backend) Sync() error {
	b.do("Sync", func(d gpu.Device) error {
		if err := d.Sync(); err != nil {
			return err
		}
		b.readFlags()
		return nil
	})
	return b.Err()
}

// Close waits for the queued work and releases the backend's resources:
// cached device memory, the stream, cuBLASLt and the kernels. Tensors still
// alive must not be used afterwards. Close returns the first error met
// while closing (the sticky error of the ops stays with Err).
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	if err := b.dev.Acquire(); err != nil {
		return err
	}
	defer b.dev.Release()
	err := b.dev.Sync()
	b.readFlags()
	b.closed = true
	keep := func(e error) {
		if e != nil && err == nil {
			err = e
		}
	}
	keep(b.alloc.releaseAll())
	for k, p := range b.rope {
		keep(b.dev.Free(p))
		delete(b.rope, k)
	}
	keep(b.dev.Free(b.flags))
	if b.fork != nil {
		keep(b.fork.Destroy())
	}
	keep(b.dev.Close())
	return err
}

// setErr records err unless an error is already recorded.
func (b *Backend) setErr(err error) {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	if b.err == nil {
		b.err = err
	}
}

// setFatal records err, from the CUDA driver or a closed backend, unless
// an error is already recorded; ClearErr cannot clear it.
func (b *Backend) setFatal(err error) {
	b.errMu.Lock()
	defer b.errMu.Unlock()
	if b.err == nil {
		b.err, b.fatal = err, true
	}
}

// ClearErr forgets the recorded error so that the ops run again, and
// returns nil, when the error left the device intact: an op's arguments
// found wrong before anything was queued (shapes, dtypes, an allocation
// that did not fit), or a kernel's check of its data (an id outside the
// table). The tensors the failed op and the ops skipped after it would
// have written hold what they held before, or what the kernel wrote:
// recompute or upload them. An error of the CUDA driver (the context may
// be lost) or of a closed backend cannot be cleared: ClearErr then returns
// an error wrapping it and the backend stays failed; make a new backend
// (New) and upload the state again. Call it while no other goroutine
// queues ops on the backend.
func (b *Backend) ClearErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errMu.Lock()
	defer b.errMu.Unlock()
	switch {
	case b.err == nil:
		return nil
	case b.fatal || b.closed:
		return fmt.Errorf("cuda: ClearErr: the error came from the CUDA driver or a closed backend, which may have lost its context; make a new backend and upload the state again: %w", b.err)
	}
	b.err = nil
	return nil
}

// failed reports whether an error is recorded.
func (b *Backend) failed() bool { return b.Err() != nil }

// errClosed is recorded by ops on a closed backend.
var errClosed = errors.New("the backend is closed")

// do runs fn with the device acquired and the backend locked; an error is
// recorded as "cuda: <op>: <err>". Ops are skipped once an error is
// recorded.
func (b *Backend) do(op string, fn func(d gpu.Device) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.setFatal(fmt.Errorf("cuda: %s: %w", op, errClosed))
		return
	}
	if b.failed() && op != "Sync" {
		return
	}
	if err := b.dev.Acquire(); err != nil {
		b.setFatal(fmt.Errorf("cuda: %s: %w", op, err))
		return
	}
	defer b.dev.Release()
	if err := fn(b.dev); err != nil {
		b.setFatal(fmt.Errorf("cuda: %s: %w", op, err))
	}
}

// fail records an argument error found by op's checks. Errors that kernels
// queued earlier may have found in their data come first: they are read
// back (waiting for the GPU) before err is recorded.
func (b *Backend) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pending) > 0 && !b.closed && b.dev.Acquire() == nil {
		if b.dev.Sync() == nil {
			b.readFlags()
		}
		b.dev.Release()
	}
	b.setErr(err)
}

// ---------------------------------------------------------------------------
// Data checks made by kernels. A kernel that validates indices gets a pointer
// to its op's pair of int32 flags (err[0] |= 1 on failure, err[1] = one bad
// value); they are read back and cleared when the host waits for the GPU
// anyway.

type flagSlot int

const (
	flagEmbedding flagSlot = iota
	flagEmbeddingBackward
	flagCrossEntropy
	flagTopKBackward
	flagGatherRows
	flagCombineRows
	flagCombineRowsBackward
	flagRouting
	flagGrouped
	flagGEMM // the GEMM engine: err[1] = the chunk whose flag wait ran out, -1 = no sm_90a code
	// The slots of the data checks of kernels whose host side lives
	// outside this package (NewDataCheck), after the backend's own.
	firstDataCheck
	numFlags = firstDataCheck + maxDataChecks
)

const flagBytes = int(numFlags) * 8

// pendingFlag is a launch whose data check is not read back yet; explain
// turns the bad value into the op's error.
type pendingFlag struct {
	slot    flagSlot
	explain func(bad int32) error
}

// flagPtr returns the device address of slot's flags and remembers the
// launch, to explain a failure.
func (b *Backend) flagPtr(slot flagSlot, explain func(bad int32) error) gpu.Ptr {
	b.pending = append(b.pending, pendingFlag{slot, explain})
	return b.flags.Offset(int(slot) * 8)
}

// readFlags reads the flags back (the caller has synchronised) and records
// the failure of the earliest pending launch whose slot is flagged.
func (b *Backend) readFlags() {
	if len(b.pending) == 0 {
		return
	}
	var f [numFlags * 2]int32
	if err := b.dev.CopyDtoH(unsafe.Pointer(&f[0]), b.flags, flagBytes); err != nil {
		b.setFatal(fmt.Errorf("cuda: reading kernel data checks: %w", err))
		return
	}
	for _, p := range b.pending {
		if f[2*p.slot] != 0 {
			b.setErr(p.explain(f[2*p.slot+1]))
			break
		}
	}
	b.pending = b.pending[:0]
	if f != ([numFlags * 2]int32{}) {
		if err := b.dev.Memset8(b.flags, 0, flagBytes); err != nil {
			b.setFatal(fmt.Errorf("cuda: clearing kernel data checks: %w", err))
		}
	}
}
