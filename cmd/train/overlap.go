package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/asynctp/asynctp/ablate"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/launch"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// overlapStrategies are the site strategies this run can build, one per
// name (overlap/strategies), and why the others cannot be built at all:
// fused needs symmetric memory with peer pointers, which only the GPU
// transports nvshmem and nccl+nvshmem give. Each strategy says per site
// whether the site's group and backend can run it (a group that spans
// hosts, the expert path without symmetric memory...).
func overlapStrategies(cfg Config) ([]overlap.Strategy, map[string]string) {
	all := strategies.All(strategyOptions(cfg))
	if launch.Symmetric(cfg.Parallel.Comm) && cfg.Device != "cpu" {
		return all, nil
	}
	missing := map[string]string{
		"fused": fmt.Sprintf("it needs symmetric memory with peer pointers: --comm nvshmem or nccl+nvshmem on GPUs (this run: --comm %s, --device %s): the GEMM engine reads the gathered rows as the copy engine lands them from the peers' symmetric memory",
			orDefault(cfg.Parallel.Comm, "(none)"), orDefault(cfg.Device, "auto")),
	}
	return all[:2], missing
}

// strategyOptions configure the run's strategies: the fused transfer.
func strategyOptions(cfg Config) strategies.Options {
	return strategies.Options{Transfer: fusedTransfer(cfg)}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// newChooser is one rank's chooser of the site strategies; tune is what
// "auto" picks from (nil: no cache); sh is the rank's shadow mode (nil:
// off); transport is the run's (--comm), for the summary of what carries
// each site kind; avail are the rank's strategies (rankStrategies; nil:
// the run's, overlapStrategies).
func newChooser(cfg Config, tune overlap.Tuning, sh *overlap.Shadow, transport string, avail []overlap.Strategy) (*overlap.Chooser, error) {
	all, missing := overlapStrategies(cfg)
	if avail == nil {
		avail = all
	}
	opts := []overlap.ChooserOption{overlap.WithTransports(collectivesOf(transport), symmetricOf(transport))}
	if tune != nil {
		opts = append(opts, overlap.WithTuning(tune))
	}
	if sh != nil {
		opts = append(opts, overlap.WithShadow(sh))
	}
	return overlap.NewChooser(cfg.Overlap, avail, missing, opts...)
}

// collectivesOf and symmetricOf name the transports of a run's collectives
// and of its symmetric memory ("" where it has none).
func collectivesOf(transport string) string {
	if transport == launch.Hybrid {
		return launch.NCCL
	}
	return transport
}

func symmetricOf(transport string) string {
	if launch.Symmetric(transport) {
		return launch.NVSHMEM
	}
	return ""
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
// with the run's pipelined strategy, and its fused strategy where it has
// one (fusedOf).
func tuning(cfg Config, b tensor.Backend, dt tensor.DType, world comm.Comm) (overlap.Tuning, error) {
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
	return &ablate.AutoTune{Lookup: l, World: world, Pipelined: strategies.Pipelined{Options: strategyOptions(cfg)}, Fused: fusedOf(cfg),
		Seed: cfg.Model.Seed, Warmup: autotuneWarmup, Reps: autotuneReps}, nil
}

// fusedOf is the run's fused strategy (nil where it has none: no
// symmetric memory on GPUs), a candidate of --autotune where it supports a
// site.
func fusedOf(cfg Config) overlap.Strategy {
	avail, _ := overlapStrategies(cfg)
	for _, s := range avail {
		if s.Name() == (strategies.Fused{}).Name() {
			return s
		}
	}
	return nil
}

// The micro-runs of --autotune: warm-up rounds, then timed rounds, each
// running every candidate once per direction (the slowest rank's time);
// 15 rounds let a site's few comparisons be significant (ablate.Stats).
const (
	autotuneWarmup = 2
	autotuneReps   = 15
)

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
	if _, err := tuning(cfg, nil, tensor.Float32, nil); err != nil {
		return err
	}
	_, err := newChooser(cfg, nil, nil, cfg.Parallel.Comm, nil)
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
