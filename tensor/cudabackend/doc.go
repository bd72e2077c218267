// Package cudabackend implements tensor.Backend on one NVIDIA GPU: bf16 (or
// f32) storage with fp32 accumulation, GEMMs through cuBLASLt, every other
// op a kernel of cuda/kernels launched on the backend's stream. The CPU
// backend (tensor/cpu) is the reference it is tested against
// (tensor/backendtest).
//
//	b, err := cudabackend.New(0) // GPU 0
//	if err != nil { ... }        // no driver, no GPU, or no kernels image: the error says which
//	defer b.Close()
//
// # Kernels image
//
// The kernels are compiled by cuda/kernels/build.sh (nvcc) into
// build/asynctp_kernels.fatbin and loaded at New with cuModuleLoadData. New
// looks for it at $ASYNCTP_KERNELS, then next to the executable, then in the
// build folder of the repository holding the working directory; WithKernels
// names it explicitly. See FindKernels.
//
// # Threads
//
// CUDA keeps the current context per OS thread. Every op of a Backend locks
// its goroutine to its OS thread and makes the device's primary context
// current there for the op's duration, then unlocks it: callers need not
// lock anything, and may use a Backend from any goroutine (ops are
// serialised; they share one stream). The context stays current on the
// threads that ran ops, which is harmless for other users of the primary
// context (cuBLASLt, NCCL, NVSHMEM), who bind it too.
//
// # Asynchrony and errors
//
// Ops queue work and return. Argument errors (shapes, dtypes, a tensor of
// another device) are found on the host and recorded at once as the sticky
// error, named "cuda: <op>: ..."; later ops are then no-ops. These checks are
// shared with the CPU reference (tensor/opcheck), so both accept the same
// calls; the policy in check.go and the kernels' size limits are this
// backend's own. Errors in the
// data that only the kernels see (an Embedding id outside the table, a
// CrossEntropy target ≥ V) are flagged on the device and read back at the
// next Sync, Download or SumSquares (the host waits there anyway), so Err
// reports them only after one of those. Launch failures and faults surface
// the same way, at the next call that waits.
//
// # Streams and collectives
//
// Every op is queued on one stream, Stream (StreamHandle is its raw
// CUstream). Hand it to a GPU transport as the comm.Stream of its ops
// (parallel/model's Options.Stream does, for every collective of the model
// and of its TP and EP layers), and collectives are ordered on the device
// with the backend's ops, without host synchronisation:
//
//   - ops and collectives queued on the backend's stream run in the order
//     they were queued (comm/nccl queues its kernels on it directly);
//   - a transport that runs its ops on a stream of its own (comm/nvshmem)
//     first makes that stream wait for the backend's stream (so the op sees
//     every op queued before it), and Work.Wait(backend.Stream()) makes the
//     backend's stream wait for the op (cuStreamWaitEvent), so every op
//     queued after Wait sees its result;
//   - so, once Wait(backend.Stream()) has been called for a collective's
//     Work, the host-side reads (Download, SumSquares, Sync) wait for it too,
//     as they wait for everything queued on the stream, and its tensors may
//     be freed: the caching allocator reuses blocks in the stream's order.
//
// The contract of comm.Work is the caller's part: until Wait has been
// called for an op (on this stream), the backend must neither read its
// destination nor write its source, and its tensors must not be freed.
// Other streams (a transport's, or the caller's own) are ordered against
// this one only through events, as Work.Wait does. Queuing on the stream
// from other code needs the device's primary context current on the calling
// thread (cuda.Context.Bind); the backend's lock does not cover it, which is
// fine: a CUDA stream may be used from several threads.
//
// # Dtypes
//
// Device tensors are BFloat16, Float32 or Int32 (no Float64). Every float
// op accepts BFloat16 and Float32 (all float operands of one op share a
// dtype), except where the interface fixes fp32: RMSNorm's rstd,
// Attention's lse, CrossEntropy's losses and AdamW's m, v and master are
// Float32. AdamW takes p and g of either float dtype independently. Ids and
// targets are Int32. Upload and Download convert from and to any host dtype
// (Float64 included); Copy converts between BFloat16 and Float32 on the
// device (rounding to nearest even).
//
// Attention: any head dim D ≤ 128, grouped-query heads (k, v with Hkv
// heads dividing q's H): CUDA-core kernels (bf16 and f32, any D) and
// tensor-core kernels (bf16, D = 64 or 128, 16-byte aligned tensors) — on
// an sm_90 GPU the backward and the D = 128 forward on wgmma
// (AttentionWGMMA), elsewhere on mma.sync (AttentionFA2), with the same
// bits — chosen automatically; WithAttention picks one.
//
// MoE: Backend implements tensor.MoEOps (TopK, GatherRows, CombineRows,
// LogSumExp and their backwards), and RoutingPlan computes a routing plan on
// the GPU.
//
// # Memory
//
// Zeros takes blocks from a caching allocator (size classes, free lists per
// class), so per-step activations do not call cuMemAlloc; Free, or the
// garbage collector finding a tensor's buffer unreachable, gives the block
// back to its list. Blocks are reused in stream order, which is safe
// because every op runs on the one stream, and collectives on other streams
// are ordered against it (see Streams and collectives). MemStats and
// EmptyCache inspect and trim the cache.
//
// # Determinism
//
// No kernel accumulates floats with atomics: two runs of the same ops on the
// same GPU give bit-identical results (see cuda/kernels/README.md).
//
// # Phase timing
//
// StartPhases times the phases that layers mark (tensor.MarkPhase) on
// the backend's stream with CUDA timing events, for where a profiler does
// not run (nsys may make no report on a shared GPU machine, and ncu
// serialises kernels, which deadlocks the fused paths' spinning kernels);
// see PhaseTimes.
//
// # Tests
//
// The tests skip, saying why, without a GPU or kernels image. On the GPU
// machine:
//
//	go test -c -o build/cudabackend.test ./tensor/cudabackend  # on the dev machine
//	bash cuda/kernels/gpu_check.sh                              # on the GPU machine
//
// which builds the kernels image and runs the binary with
// ASYNCTP_KERNELS=build/asynctp_kernels.fatbin (SANITIZE=1 adds
// compute-sanitizer runs, BENCH=1 the benchmarks).
//
// Without a GPU, the same suite runs on a CPU emulator of the kernels
// (internal/emu): go test -tags asynctp_emu ./tensor/cudabackend/...
package cudabackend
