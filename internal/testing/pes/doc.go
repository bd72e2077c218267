// Package pes runs GPU tests on NVSHMEM PEs: a test starts one child process
// per PE (Run), each child joins the world (Join) and runs its job, and the
// parent judges the outputs. All PEs sit on GPU 0 when the machine has one
// GPU; start MPS first (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = 100/N per process
// is set for NVSHMEM's full MPG mode; scripts/gpu-overlap.sh shows how).
// Each runs a job over several world sizes and logs its lines; Median,
// EventTimer and PE.Time are the benchmarks' timing. Shared by the GPU tests
// of overlap/peercopy and parallel/ep/peerep.
package pes
