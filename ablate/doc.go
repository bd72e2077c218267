// Package ablate is the ablation of the overlap strategies that cmd/ablate
// runs: the matrix of cells (op × shape × world × transport × strategy),
// the per-rank runner that verifies each cell against collective on the
// same inputs and then times it, the report (Markdown, HTML with inline
// PNG charts, JSON) and the autotune cache that overlap's "auto" consults.
//
// Files, one job each: matrix.go (ops, shapes, presets, cells), run.go and
// moe.go (one rank's side of a batch of cells), timer.go (wall clock on
// the CPU; CUDA events live with the GPU ranks in cmd/ablate), metrics.go
// (the derived figures: TFLOP/s, bandwidth, ceiling), report.go and
// charts.go (the report), tune.go (the cache), env.go (the environment),
// torch.go (the PyTorch rows of bench/torch_ablate.py).
package ablate
