// Package ablate is the ablation of the overlap strategies that cmd/ablate
// runs: the matrix of cells (op × shape × world × transport × strategy),
// the per-rank runner that verifies each cell against collective on the
// same inputs and then times it, the report (Markdown, HTML with inline
// PNG charts, JSON) and the autotune cache that overlap's "auto" consults.
//
// Files, one job each: matrix.go (ops, shapes, presets, cells), gen.go
// (every rank's inputs, by hash, and the tolerances), ops.go, layers.go
// and moe.go (the cases a cell group runs: the ops, the TP and MoE layer
// cells, the expert path), run.go (one rank's side of a batch of cells),
// local.go (the CPU ranks over comm/local), timer.go (wall clock on the
// CPU; CUDA events live with the GPU ranks in cmd/ablate), result.go (a
// cell's outcome and its derived figures: TFLOP/s, bandwidth, ceiling),
// report.go, doc_blocks.go and charts.go (the report), tune.go and
// autotune.go (the cache, and timing at start), env.go (the environment),
// torch.go (the PyTorch rows of bench/torch_ablate.py).
package ablate
