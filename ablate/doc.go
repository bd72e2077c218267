// Package ablate is the ablation of the overlap strategies that cmd/ablate
// runs: the matrix of cells (op × shape × world × transport × strategy),
// the per-rank runner that verifies each cell against collective on the
// same inputs and then times the strategies of a cell group together in
// interleaved rounds, the statistics that tell a difference from noise,
// the report (Markdown, HTML with inline PNG charts, JSON) that opens with
// the answer, and the autotune cache that overlap's "auto" consults.
//
// A strategy beats collective only when the confidence interval of its
// median per-round time ratio (order statistics, at a level corrected for
// the run's number of comparisons) lies below 1/(1 + a minimum effect),
// and each half of the rounds, in the order they ran, shows it too (the
// difference replicated within the run: Stats); otherwise the cell, the
// answer and the cache say "no significant difference" and keep
// collective. World-1 cells exchange nothing: they
// measure the cost of a strategy's machinery and are never a speedup or a
// cache entry.
//
// Files, one job each: matrix.go (ops, shapes, models and their sites,
// presets, cells), gen.go (every rank's inputs, by hash, and the
// tolerances), ops.go, layers.go and moe.go (the cases a cell group runs:
// the ops, the TP and MoE layer cells, the expert path), run.go (one
// rank's side of a batch of cells: checks, interleaved rounds), local.go
// (the CPU ranks over comm/local), timer.go (wall clock on the CPU; CUDA
// events live with the GPU ranks in cmd/ablate), result.go (a cell's
// outcome and its derived figures: TFLOP/s, bandwidth, ceiling, the
// comparison with collective), stats.go (intervals and verdicts),
// answer.go (the short answer per op and world), report.go, doc_blocks.go
// and charts.go (the report), tune.go and autotune.go (the cache, and
// timing at start), env.go (the environment), torch.go (the PyTorch rows
// of bench/torch_ablate.py).
package ablate
