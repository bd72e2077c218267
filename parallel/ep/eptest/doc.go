// Package eptest is the conformance suite of ep.ExpertPath, the
// communication site of an MoE layer (DeepEP's contract: Layout →
// Dispatch → Handle → SortByExpert/UnsortByExpert → Combine, and
// CombineBackward/DispatchBackward with the same handle, Release). Every
// implementation — the collective *ep.Dispatcher, the NVSHMEM dispatch and
// combine — runs the same checks against a float64 reference of the
// routing, on seeded random non-zero inputs that every rank regenerates
// (each rank knows every rank's tokens, choices, weights and the rows the
// suite plays for the experts), with every output poisoned with NaN.
//
// # What is checked
//
// Rank.CheckStep drives one step by hand and checks, on every rank:
// the layout's counts; the handle's contract (Capacity, GlobalTokens,
// GlobalRouted, Dropped, SendCounts, RecvCounts, RecvPerExpert,
// ExpertCounts, the Plan's kept slots, SendRows, RecvRows); the received
// rows, bit for bit, in the documented order (source rank, then local
// expert, then the source's token order); SortByExpert and UnsortByExpert,
// bit for bit; Combine with known expert outputs (Σ_j w·y per token over
// the kept slots, 0 for a token whose slots were all dropped);
// CombineBackward's rows (w·dout at the experts' ranks) and dweights
// (⟨dout, y⟩, 0 for a dropped slot); DispatchBackward (the sum of each
// token's slot gradients); and, from the path's own outputs, the adjoint
// identities over the EP group, Σ⟨Dispatch(x), g⟩ = Σ⟨x, DispatchBackward(g)⟩
// and Σ⟨Combine(y), dout⟩ = Σ⟨y, CombineBackward(dout)⟩. The drop rule is
// layers.RoutingPlan's, derived independently: each expert keeps its first
// ceil(CF·T·K/E) slots of the T tokens of the token group, in token-group
// rank order, then token order, then choice order.
//
// Rank.CheckScenario runs the Steps of a Scenario on one path: two steps of
// different sizes on every rank (the persistent buffers grow and shrink),
// then the first step twice more, whose outputs must be the first's bits
// (the combine and the backwards are deterministic). Scenarios cover
// dropless and capacity factors 1 and 1.5 (with drops, and with whole
// ranks whose slots are all dropped), top-1, 2 and 8, experts no token
// chooses, an EP rank that receives no row, uneven tokens per rank, and
// ranks that bring no token.
// Rank.CheckMaxTokens checks that a path built with Config.MaxTokens
// refuses a larger step with an error naming both numbers, then still runs
// a step within the bound. Rank.CheckAll runs all of it.
//
// # Ranks
//
// A check runs on one rank: every rank of the token group calls it with
// the same arguments and seed (its own groups, backend and stream), so the
// suite runs alike on goroutine ranks and on process ranks. RunLocal runs
// CheckAll on goroutine ranks over comm/local with the CPU backend in
// float64 and float32 (float64 tolerance 1e-12, float32 1e-5): EP sizes as
// given, with synchronous collectives and with local.Async (a path that
// reads a result before its Work is waited for fails), and with a token
// group twice the EP group (comm.Grid over a world of 2·P ranks, the world
// as the token group). parallel/ep's TestConformance runs it on
// *ep.Dispatcher for EP 1, 2, 3 and 4.
//
// A failing check returns an error naming the rank, the scenario, the step,
// the quantity and what was expected. On goroutine ranks the other ranks
// are aborted; on process ranks they wait in their next collective until
// the transport's timeout.
//
// # On a GPU
//
// A GPU implementation runs the suite on process ranks, one per NVSHMEM PE
// (or NCCL rank), as overlap/peercopy's gpu_test.go runs overlaptest for
// the TP sites: a test starts N copies of the test binary with
// commtest.RunProcesses (Test: "TestHelperProcess", a job variable in the
// environment, NVSHMEM_DISABLE_NVLS=1, ASYNCTP_TEST_DEVICE=rank%gpus, and
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/N when the PEs share one GPU under
// MPS), and each copy's TestHelperProcess joins the rendezvous, builds its
// cudabackend.Backend and its nvshmem.Comm world, and calls
//
//	r := eptest.Rank{Group: world, Backend: b, Stream: b.Stream(),
//		NewPath: newNVSHMEMPath, DType: tensor.BFloat16, Seed: 11}
//	err := r.CheckAll() // then b.Sync(), and report per rank
//
// in bf16 (tolerance 1e-2) and f32, for worlds of 2 and 4 PEs. For the
// token group wider than the EP group, split the world first (collective):
//
//	g, err := comm.NewGrid(world, N, 1, N/2)
//	r.Group, r.Tokens = g.EPGroup, world
//
// NewPath receives the shape of every step (Config: MaxTokens, TopK, Cols,
// DType) to size symmetric buffers; it returns an error wrapping
// errors.ErrUnsupported for a Config the implementation does not support
// (the scenario is skipped and logged through Rank.Logf), the same on
// every rank. A path with a Close method is closed after each scenario
// (drain the device before freeing symmetric memory, as peercopy does).
package eptest
