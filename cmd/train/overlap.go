package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/asynctp/asynctp/ablate"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep/peerep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// overlapStrategies are the site strategies this run can build, beside
// collective, and why the others cannot be built. The decomposed
// (pipelined) strategy runs on every transport; on NVSHMEM the GPU
// processes use its peer-copy form (gpuOverlap).
func overlapStrategies(cfg Config) ([]overlap.Strategy, map[string]string) {
	if cfg.Parallel.Comm == "nvshmem" && cfg.Device != "cpu" {
		// The GPU ranks check it per site (peercopy.Fused.Supports: the
		// CUDA backend, an sm_90a GPU for the GEMM engine, bf16, widths of
		// multiples of 8) and refuse an explicit request that fails there;
		// the expert path's is peerep.Fused (the grouped GEMM engine, bf16),
		// which holds the TP sites' peercopy.Fused with its transfer.
		return []overlap.Strategy{overlap.Pipelined{}, peerep.Fused{Fused: fusedStrategy(cfg)}}, nil
	}
	missing := map[string]string{
		"fused": fmt.Sprintf("it needs --comm nvshmem on GPUs (this run: --comm %s, --device %s): the GEMM engine reads the gathered rows as the copy engine lands them from the peers' symmetric memory",
			orDefault(cfg.Parallel.Comm, "(none)"), orDefault(cfg.Device, "auto")),
	}
	return []overlap.Strategy{overlap.Pipelined{}}, missing
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// newChooser is one rank's chooser of the site strategies; tune is what
// "auto" picks from (nil: no cache); sh is the rank's shadow mode (nil:
// off); extra are the strategies of this rank's transport and backend
// (GPU ones) that take the place of the generic ones of the same name.
func newChooser(cfg Config, tune overlap.Tuning, sh *overlap.Shadow, extra ...overlap.Strategy) (*overlap.Chooser, error) {
	avail, missing := overlapStrategies(cfg)
	for _, s := range extra {
		for i, a := range avail {
			if a.Name() == s.Name() {
				avail[i] = s
				s = nil
				break
			}
		}
		if s != nil {
			avail = append(avail, s)
		}
	}
	var opts []overlap.ChooserOption
	if tune != nil {
		opts = append(opts, overlap.WithTuning(tune))
	}
	if sh != nil {
		opts = append(opts, overlap.WithShadow(sh))
	}
	return overlap.NewChooser(cfg.Overlap, avail, missing, opts...)
}

// usesAuto says whether any site may be chosen by "auto".
func usesAuto(c overlap.Config) bool {
	if c.Default == "auto" {
		return true
	}
	for _, v := range c.Sites {
		if v == "auto" {
			return true
		}
	}
	return false
}

// autotunePath is the cache of the run and whether it was given
// explicitly: --autotune-cache, else OUT/autotune.json.
func autotunePath(cfg Config) (string, bool) {
	if cfg.AutotuneCache != "" {
		return cfg.AutotuneCache, true
	}
	return filepath.Join(cfg.Train.OutDir, "autotune.json"), false
}

// tuning is the autotune cache of a rank whose backend is b and whose
// tensors are dt, for "auto"; nil when no site uses auto or there is no
// cache at the default place. A cache given explicitly must exist, unless
// --autotune: then a missing one starts empty, and the result is an
// *ablate.AutoTune that tunes the sites the cache lacks on world's ranks
// with pipelined, the run's pipelined strategy (nil on a check without
// ranks), and the run's fused strategy where it has one (fusedOf).
func tuning(cfg Config, b tensor.Backend, dt tensor.DType, world comm.Comm, pipelined overlap.Strategy) (overlap.Tuning, error) {
	if !usesAuto(cfg.Overlap) {
		return nil, nil
	}
	path, explicit := autotunePath(cfg)
	c, exists, err := ablate.LoadCache(path)
	if err != nil {
		return nil, err
	}
	if !exists && !cfg.Autotune {
		if explicit {
			return nil, fmt.Errorf("--autotune-cache %s: no such file: expected an autotune cache written by cmd/ablate (or --autotune to write one)", path)
		}
		return nil, nil
	}
	gpu := "cpu"
	if cb, ok := b.(*cudabackend.Backend); ok {
		gpu = cb.DeviceName()
	}
	p := cfg.Parallel
	tokens := cfg.Train.Batch * cfg.Train.Seq / max(1, p.DP) // a replica's tokens per forward
	if m := cfg.Train.MicroBatch; m > 0 {
		tokens = m * cfg.Train.Seq
	}
	l := ablate.Lookup{Cache: c, Path: path, Transport: p.Comm, GPU: gpu, Tokens: tokens, DType: dt.String()}
	if !cfg.Autotune {
		return l, nil
	}
	return &ablate.AutoTune{Lookup: l, World: world, Pipelined: pipelined, Fused: fusedOf(cfg),
		Seed: cfg.Model.Seed, Warmup: autotuneWarmup, Reps: autotuneReps}, nil
}

// fusedOf is the run's fused strategy (nil where it has none: not
// NVSHMEM on GPUs), a candidate of --autotune where it supports a site.
func fusedOf(cfg Config) overlap.Strategy {
	avail, _ := overlapStrategies(cfg)
	for _, s := range avail {
		if s.Name() == (peerep.Fused{}).Name() {
			return s
		}
	}
	return nil
}

// The micro-runs of --autotune: warm-up calls, then timed repetitions (the
// median of the slowest rank's) per direction and strategy.
const (
	autotuneWarmup = 2
	autotuneReps   = 5
)

// pipelinedOf is the chooser's pipelined strategy: the GPU form among
// extra, else overlap.Pipelined.
func pipelinedOf(extra []overlap.Strategy) overlap.Strategy {
	for _, s := range extra {
		if s.Name() == (overlap.Pipelined{}).Name() {
			return s
		}
	}
	return overlap.Pipelined{}
}

// saveAutotune writes what tune measured into its cache (world rank 0:
// merged with what the file holds, atomically); it returns the error of a
// micro-run on every rank.
func saveAutotune(tune overlap.Tuning, rank0 bool) error {
	at, ok := tune.(*ablate.AutoTune)
	if !ok {
		return nil
	}
	if err := at.Err(); err != nil {
		return err
	}
	if m := at.Measured(); rank0 && len(m.Entries) > 0 {
		if err := ablate.MergeSave(at.Path, m); err != nil {
			return fmt.Errorf("--autotune: writing the cache: %w", err)
		}
	}
	return nil
}

// checkOverlap refuses, before any work, an overlap configuration that
// names a strategy this run cannot build, or an autotune cache that
// cannot be read.
func checkOverlap(cfg Config) error {
	if _, err := tuning(cfg, nil, tensor.Float32, nil, nil); err != nil {
		return err
	}
	_, err := newChooser(cfg, nil, nil)
	return err
}

// printShadow prints what shadow mode samples (world rank 0; nothing when
// it is off).
func printShadow(sh *overlap.Shadow) {
	if sh == nil {
		return
	}
	c := sh.Config()
	bound := "no fail_above: the summary flags a site above its dtype's tolerance"
	if c.FailAbove != nil {
		bound = fmt.Sprintf("fail_above %g stops the run after the step", *c.FailAbove)
	}
	sites := sh.Sites()
	fmt.Printf("shadow: every %d steps, %d sites against collective (%s): %s\n", c.Every, len(sites), bound, strings.Join(sites, ", "))
}

// printOverlap prints which strategy each site kind got (world rank 0).
func printOverlap(ch *overlap.Chooser) {
	for _, line := range ch.Summary() {
		fmt.Println("overlap:", line)
	}
}

// gpuOverlap is the GPU form of the strategies for this rank: on a
// transport with symmetric memory (NVSHMEM) and the CUDA backend, the
// pipelined strategy moves its chunks by copy-engine pulls from peer
// pointers (overlap/peercopy) instead of exchanges through the transport,
// and the MoE expert path has its pipelined form: the device-side dispatch
// and combine over symmetric memory (parallel/ep/peerep); the fused
// strategy of the TP sites is the GEMM engine fed by those pulls, or by
// puts with --fused-transfer put (peercopy.Fused), and of the expert path
// the grouped GEMM engine waiting per 128-row block on the dispatch's
// counters, its down projection's blocks sent home as they are stored
// (peerep.Fused, which holds peercopy.Fused for the TP sites).
func gpuOverlap(cfg Config, c comm.Comm, b tensor.Backend) []overlap.Strategy {
	cb, ok := b.(*cudabackend.Backend)
	if !ok || cb.Stream() == nil {
		return nil
	}
	if _, ok := comm.SymmetricOf(c); !ok {
		return nil
	}
	return []overlap.Strategy{peerep.Pipelined{}, peerep.Fused{Fused: fusedStrategy(cfg)}}
}

// moeMaxTokens bounds the tokens an MoE layer routes per rank and forward
// (the expert path's buffers, ep.Parallel.MaxTokens): the whole batch of a step,
// or of a micro-batch (over every replica) with --micro-batch, which no
// rank's slice exceeds. The pipelined expert path sizes its symmetric
// buffers by it.
func moeMaxTokens(cfg Config) int {
	if m := cfg.Train.MicroBatch; m > 0 { // one forward takes a micro-batch of every replica
		return m * max(cfg.Parallel.DP, 1) * cfg.Train.Seq
	}
	return cfg.Train.Batch * cfg.Train.Seq
}
