package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/asynctp/asynctp/ablate"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/overlap/strategies"
)

func main() {
	if os.Getenv(batchEnv) != "" {
		os.Exit(child())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, nil); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "ablate:", err)
		os.Exit(1)
	}
}

// presets are named matrices.
var presets = map[string]ablate.Matrix{
	// quick: every site of cmd/train's tiny models (the cache covers
	// them) on goroutine ranks (comm/local), a complete report in about
	// 35 s on 2 cores. --transports local,tcp adds process ranks over
	// comm/tcp (child processes of this binary).
	"quick": {Ops: ablate.Ops, Models: []string{"tiny"}, Worlds: []int{1, 2, 4}, Transports: []string{"local"},
		Strategies: []string{ablate.Collective, ablate.Pipelined, ablate.Fused}, DType: "f32", Warmup: 3, Reps: 20,
		Alpha: ablate.DefaultAlpha, MinEffect: ablate.DefaultMinEffectCPU},
	// gpu: the TP ops and the MoE op at 1, 2, 4 PEs on one GPU (NVSHMEM
	// PEs under MPS; NCCL and the hybrid, NCCL's collectives beside
	// NVSHMEM's symmetric memory in one process world, one rank per GPU),
	// bf16, sized to finish in about four minutes on one H200 (add
	// --models llama-70b for the large widths: its backward outputs are
	// hundreds of millions of elements, each checked on the host).
	"gpu": {Ops: ablate.Ops, Models: []string{"llama-7b", "mixtral-8x7b"}, Ms: []int{2048, 8192}, Worlds: []int{1, 2, 4},
		Transports: []string{"nccl+nvshmem", "nvshmem", "nccl"}, Strategies: []string{ablate.Collective, ablate.Pipelined, ablate.Fused},
		DType: "bf16", Warmup: 3, Reps: 20, Alpha: ablate.DefaultAlpha, MinEffect: ablate.DefaultMinEffectGPU},
}

// options are what run takes beyond the matrix.
type options struct {
	out, cache, torch, python, script string
	seed                              uint64
	timeout                           time.Duration
	progress                          string
	deadline                          time.Duration // of the whole matrix (0: none)
	fusedTransfer                     string        // the fused strategy's (peercopy.Engine.Transfer), resolved
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: expected a comma-separated list of integers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parse reads the flags into the matrix (preset, then --config, then the
// flags given) and the options.
func parse(args []string) (ablate.Matrix, options, error) {
	fs := flag.NewFlagSet("ablate", flag.ContinueOnError)
	preset := fs.String("preset", "quick", "named matrix: quick (CPU, seconds), gpu (NVSHMEM and NCCL on the GPUs here)")
	config := fs.String("config", "", "JSON `file` of the matrix (the fields of results.json's \"matrix\"); flags override it")
	ops := fs.String("ops", "", "ops: "+joinOps())
	models := fs.String("models", "", "shape presets: "+strings.Join(ablate.ModelNames(), ", "))
	ms := fs.String("m", "", "token counts M (comma-separated), instead of each model's")
	mnk := fs.String("mnk", "", "explicit shapes \"M,N,K;M,N,K\" (TP ops), beside the models'")
	worlds := fs.String("worlds", "", "world sizes (comma-separated)")
	transports := fs.String("transports", "", "transports: "+strings.Join(ablate.Transports, ", "))
	strategies := fs.String("strategies", "", "strategies: "+strings.Join(ablate.Strategies, ", "))
	dtype := fs.String("dtype", "", "f32, bf16 (GPU), f64 (CPU)")
	warmup := fs.Int("warmup", 0, "warm-up rounds per cell group, discarded (default: the preset's)")
	reps := fs.Int("reps", 0, "timed rounds per cell group: each runs every strategy once, alternating (default: the preset's)")
	alpha := fs.Float64("alpha", 0, "family-wise error rate of the run's comparisons (default: the preset's, 0.05)")
	minEffect := fs.Float64("min-effect", 0, "smallest time difference that counts, as a fraction (default: the preset's: 0.05 on the CPU, 0.02 on GPUs)")
	var o options
	fs.StringVar(&o.out, "out", "ablate-out", "output `dir` of the report")
	fs.StringVar(&o.cache, "autotune-cache", "", "autotune cache `file` to write (merged into an existing one; default OUT/autotune.json)")
	fs.StringVar(&o.torch, "torch", "auto", "PyTorch rows: auto (when python3 imports torch with CUDA), off")
	fs.StringVar(&o.python, "python", "python3", "the Python interpreter of the PyTorch rows")
	fs.StringVar(&o.script, "torch-script", "bench/torch_ablate.py", "the PyTorch rows' script")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the inputs")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Minute, "deadline of each batch of cells (one world of one transport)")
	fs.DurationVar(&o.deadline, "deadline", 0, "deadline of the cells (0: none): batches that would start later are listed as not run, each batch's deadline is cut to what is left, and the report is written")
	fs.StringVar(&o.progress, "progress", "auto", "auto (a bar on a terminal, lines otherwise), bar, lines, off")
	fs.StringVar(&o.fusedTransfer, "fused-transfer", "", "the fused cells' all-gather transfer: pull (copy-engine pulls, the default) or put (a few CTAs store each shard into the peers' buffers); default $"+peercopy.TransferEnv+", else pull")
	if err := fs.Parse(args); err != nil {
		return ablate.Matrix{}, o, err
	}
	if fs.NArg() > 0 {
		return ablate.Matrix{}, o, fmt.Errorf("unexpected arguments %q: expected only flags", fs.Args())
	}
	m, ok := presets[*preset]
	if !ok {
		return m, o, fmt.Errorf("--preset %q: expected quick or gpu", *preset)
	}
	if *config != "" {
		js, err := os.ReadFile(*config)
		if err != nil {
			return m, o, err
		}
		if err := json.Unmarshal(js, &m); err != nil {
			return m, o, fmt.Errorf("--config %s: expected a JSON matrix: %v", *config, err)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	if set["ops"] {
		m.Ops = nil
		for _, s := range list(*ops) {
			m.Ops = append(m.Ops, ablate.Op(s))
		}
	}
	if set["models"] {
		m.Models = list(*models)
	}
	if set["m"] {
		if m.Ms, err = ints(*ms); err != nil {
			return m, o, fmt.Errorf("--m %w", err)
		}
	}
	if set["mnk"] {
		if m.Explicit, err = ablate.ParseMNK(*mnk); err != nil {
			return m, o, fmt.Errorf("--mnk: %w", err)
		}
		if !set["models"] {
			m.Models = nil // explicit shapes alone, unless models are given too
		}
	}
	if set["worlds"] {
		if m.Worlds, err = ints(*worlds); err != nil {
			return m, o, fmt.Errorf("--worlds %w", err)
		}
	}
	if set["transports"] {
		m.Transports = list(*transports)
	}
	if set["strategies"] {
		m.Strategies = list(*strategies)
	}
	if set["dtype"] {
		m.DType = *dtype
	}
	if set["warmup"] {
		m.Warmup = *warmup
	}
	if set["reps"] {
		m.Reps = *reps
	}
	if set["alpha"] {
		m.Alpha = *alpha
	}
	if set["min-effect"] {
		m.MinEffect = *minEffect
	}
	if !slices.Contains([]string{"auto", "off"}, o.torch) {
		return m, o, fmt.Errorf("--torch %q: expected auto or off", o.torch)
	}
	if !slices.Contains([]string{"auto", "bar", "lines", "off"}, o.progress) {
		return m, o, fmt.Errorf("--progress %q: expected auto, bar, lines or off", o.progress)
	}
	if o.cache == "" {
		o.cache = filepath.Join(o.out, "autotune.json")
	}
	if set["fused-transfer"] {
		if o.fusedTransfer, err = peercopy.ParseTransfer(o.fusedTransfer); err != nil {
			return m, o, fmt.Errorf("--fused-transfer: %w", err)
		}
		if !slices.Contains(m.Strategies, ablate.Fused) {
			return m, o, fmt.Errorf("--fused-transfer %s: the matrix has no fused cells (strategies %s), so it would change nothing; expected --strategies with fused",
				o.fusedTransfer, strings.Join(m.Strategies, ","))
		}
	} else if o.fusedTransfer, err = peercopy.TransferFromEnv(); err != nil {
		return m, o, err
	}
	return m, o, m.Validate()
}

func joinOps() string {
	s := make([]string, len(ablate.Ops))
	for i, o := range ablate.Ops {
		s[i] = string(o)
	}
	return strings.Join(s, ", ")
}

// run is the whole program; strategies, when not nil, replace the
// goroutine ranks' strategies (tests inject a broken one; the process
// ranks of tcp build their own).
func run(ctx context.Context, args []string, stdout io.Writer, strategies map[string]overlap.Strategy) error {
	m, o, err := parse(args)
	if err != nil {
		return err
	}
	// The cache is written after every cell: one it cannot merge into is
	// refused before any.
	if _, _, err := ablate.LoadCache(o.cache); err != nil {
		return fmt.Errorf("%w (or give --autotune-cache another file)", err)
	}
	start := time.Now()
	rep := &ablate.Report{Command: "ablate " + strings.Join(args, " "), Started: start, Matrix: m, Env: ablate.BaseEnv()}
	gpu := probeGPU(&rep.Env)
	if slices.Contains(m.Strategies, ablate.Fused) {
		rep.Env.FusedTransfer = o.fusedTransfer
	}
	cells := m.Cells()
	prog := newProgress(o.progress, stdout, len(cells), filepath.Join(o.out, "ablate.log"))
	defer prog.close()

	// Cells that cannot run here, then batches of one (transport, world).
	type batch struct {
		transport string
		world     int
		cells     []ablate.Cell
	}
	var batches []*batch
	idx := map[string]*batch{}
	for _, c := range cells {
		if why := ablate.Runnable(c, gpu.count, gpu.why); why != "" {
			r := ablate.Result{Cell: c, Status: ablate.StatusNotRun, Reason: why, Tol: ablate.TolFor(c.Op, ablate.DTypeOf(c.DType))}
			rep.Results = append(rep.Results, r)
			prog.done(r)
			continue
		}
		k := fmt.Sprint(c.Transport, c.World)
		if idx[k] == nil {
			idx[k] = &batch{transport: c.Transport, world: c.World}
			batches = append(batches, idx[k])
		}
		idx[k].cells = append(idx[k].cells, c)
	}
	if strategies == nil {
		strategies = cpuStrategies()
	}
	for _, b := range batches {
		if err := ctx.Err(); err != nil {
			return err
		}
		bo := o
		if o.deadline > 0 {
			left := o.deadline - time.Since(start)
			if left < 5*time.Second {
				for _, c := range b.cells {
					r := ablate.Result{Cell: c, Status: ablate.StatusNotRun, Reason: fmt.Sprintf("--deadline %v passed before this batch", o.deadline),
						Tol: ablate.TolFor(c.Op, ablate.DTypeOf(c.DType))}
					rep.Results = append(rep.Results, r)
					prog.done(r)
				}
				continue
			}
			bo.timeout = min(o.timeout, left)
		}
		var rs []ablate.Result
		var err error
		switch b.transport {
		case "local":
			rs, err = ablate.RunLocal(b.world, b.cells, strategies, m.Warmup, m.Reps, o.seed, bo.timeout, prog.done)
		default:
			rs, err = runProcs(ctx, b.transport, b.world, b.cells, m, bo, gpu, &rep.Env, prog.done)
		}
		rep.Results = append(rep.Results, complete(b.cells, rs, err, prog.done)...)
	}
	prog.close()

	if o.torch == "auto" {
		torchTimeout := 3 * time.Minute
		if o.deadline > 0 { // the cells had the deadline; the PyTorch rows get a fixed share after it
			torchTimeout = 50 * time.Second
		}
		rows, note, err := ablate.RunTorch(ctx, o.python, o.script, torchShapes(rep.Results), m.Reps, torchTimeout)
		if err != nil {
			note = err.Error()
		}
		rep.Torch, rep.TorchNote = rows, note
		if len(rows) > 0 {
			rep.Env.Torch = rows[0].Torch
		}
	} else {
		rep.TorchNote = "--torch off: no PyTorch rows"
	}

	st := m.Stats().For(rep.Results)
	ablate.Derive(rep.Results, st)
	tuned := ablate.FromResults(rep.Results, gpu.name, st)
	rep.Stats = st
	cache, _, err := ablate.LoadCache(o.cache)
	if err != nil {
		return err
	}
	cache.Merge(tuned)
	if err := cache.Save(o.cache); err != nil {
		return fmt.Errorf("autotune cache: %w", err)
	}
	rep.Cache, rep.Tuned = o.cache, tuned.Entries
	rep.Duration = time.Since(start).Round(time.Millisecond).String()
	if err := rep.Write(o.out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreport: %s (also %s); autotune cache: %s\n\n",
		filepath.Join(o.out, "report.md"), strings.Join(append([]string{"report.html", "results.json"}, rep.Charts...), ", "), o.cache)
	fmt.Fprint(stdout, rep.AnswerText())
	return nil
}

// cpuStrategies are the strategies of the CPU ranks (local, tcp): the
// whole registry, the fused strategy included, which refuses every CPU
// cell (its Supports: the GEMM engine over NVSHMEM on GPUs), so that its
// cells are listed with its own reason.
func cpuStrategies() map[string]overlap.Strategy {
	return ablate.Registry(strategies.Options{})
}

// complete returns rs with a failed result for every cell of the batch
// that has none (its ranks died or could not start: err says why).
func complete(cells []ablate.Cell, rs []ablate.Result, err error, done func(ablate.Result)) []ablate.Result {
	have := map[string]bool{}
	for _, r := range rs {
		have[r.ID()] = true
	}
	why := "no result"
	if err != nil {
		why = err.Error()
	}
	for _, c := range cells {
		if !have[c.ID()] {
			r := ablate.Result{Cell: c, Status: ablate.StatusFailed, Reason: why, Tol: ablate.TolFor(c.Op, ablate.DTypeOf(c.DType))}
			rs = append(rs, r)
			done(r)
		}
	}
	return rs
}

// torchShapes are the shapes of the timed GPU cells at world 1, for the
// PyTorch rows (world size 1 on one GPU).
func torchShapes(rs []ablate.Result) []ablate.TorchShape {
	seen := map[string]bool{}
	var out []ablate.TorchShape
	for _, r := range rs {
		if r.Transport == "local" || r.Transport == "tcp" || r.Status != ablate.StatusOK || r.Dir != "fwd" {
			continue
		}
		s := ablate.TorchShape{Op: string(r.Op), M: r.Shape.M, N: r.Shape.N, K: r.Shape.K}
		if r.Op == ablate.OpMoEDispatchCombine {
			s.K = r.Shape.TopK
		}
		k := fmt.Sprint(s)
		if !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	return out
}
