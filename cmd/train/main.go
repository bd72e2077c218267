// Command train trains a GPT model. With no flags it trains the tiny preset
// on the built-in corpus on the CPU; see README.md and -help.
//
// A parallel layout (--tp, --dp, --ep) runs its ranks as goroutines of this
// process (--comm local, parallel.go) or as processes (--comm tcp, nccl,
// nvshmem; rank.go): started by --nproc's own launcher (launch.Spawn), or by
// torchrun, srun or mpirun, whose variables make this process one rank.
// Package launch opens every rank's world (transport, backend, grid).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/asynctp/asynctp/cmd/train/internal/corpus"
	"github.com/asynctp/asynctp/hf"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor/cudabackend"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
	"github.com/asynctp/asynctp/train/routing"
)

func main() {
	ctx := stopOnSignals()
	err := dispatch(ctx, os.Args[1:])
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	default:
		msg := err.Error()
		if !strings.HasPrefix(msg, "train: ") { // the train package's errors say it already
			msg = "train: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(exitStatus(err))
	}
}

// exitStatus is the status of a run that ended with err: 128 + the signal's
// number for a run a signal stopped (130 for SIGINT, 143 for SIGTERM, as a
// shell reports a process the signal killed), so that a script or a
// launcher tells an interrupted run from a failed one; 1 for any other
// error.
func exitStatus(err error) int {
	if s, ok := stoppedBy.Load().(syscall.Signal); ok && errors.Is(err, context.Canceled) {
		return signalStatus(s)
	}
	return 1
}

// signalStatus is the conventional exit status of a process stopped by s.
func signalStatus(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}

// stoppedBy is the first SIGINT or SIGTERM the process received (a
// syscall.Signal), unset before one.
var stoppedBy atomic.Value

// dispatch runs a subcommand (export, logits, routing-diff, tokens) or a
// training run.
func dispatch(ctx context.Context, args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "export":
			return runExport(args[1:])
		case "logits":
			return runLogits(args[1:])
		case "routing-diff":
			return runRoutingDiff(args[1:])
		case "tokens":
			return runTokens(args[1:])
		}
	}
	return run(ctx, args)
}

// secondSignal receives the second and later SIGINT or SIGTERM when
// forwardSecond is set (--nproc's launcher passes them on); otherwise the
// second signal ends the process at once.
var (
	secondSignal  = make(chan os.Signal, 4)
	forwardSecond atomic.Bool
)

// stopOnSignals returns a context that the first SIGINT or SIGTERM cancels
// (the run stops after the current step, or inside a long one, with a
// checkpoint, and the process exits 130 or 143: exitStatus); a second one
// exits at once with the second signal's status, leaving the last complete
// checkpoint (they are written under a temporary name and renamed into
// place).
func stopOnSignals() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		if n, ok := s.(syscall.Signal); ok {
			stoppedBy.Store(n)
		}
		fmt.Fprintf(os.Stderr, "train: %v: stopping with a checkpoint after the current step (or inside it); a second signal stops at once\n", s)
		cancel(fmt.Errorf("interrupted by %v: %w", s, context.Canceled))
		for s := range sigs {
			if forwardSecond.Load() {
				secondSignal <- s
				continue
			}
			fmt.Fprintf(os.Stderr, "train: a second %v: stopping at once; the last complete checkpoint stays as it is\n", s)
			os.Exit(signalStatus(s))
		}
	}()
	return ctx
}

func run(ctx context.Context, args []string) error {
	info, org, err := startedBy()
	if err != nil {
		return err
	}
	cfg, err := loadConfigIn(args, org)
	if err != nil {
		return err
	}
	if err := prepare(&cfg, org); err != nil {
		return err
	}
	if cfg.Train.Resume != "" {
		if err := cfg.checkResume(); err != nil {
			return err
		}
	}
	if err := checkOverlap(cfg); err != nil {
		return err
	}
	if cfg.cpuProfile != "" && !(cfg.Parallel.NProc > 0 && !org.launched) { // --nproc's launcher itself trains nothing
		stop, err := startCPUProfile(cfg.cpuProfile, info.Rank, info.WorldSize)
		if err != nil {
			return err
		}
		defer stop()
	}
	if holdsLock(org, info.Rank) {
		release, err := claimOutDir(cfg)
		if err != nil {
			return err
		}
		defer release()
	}
	switch p := cfg.Parallel; {
	case org.launched: // a rank of torchrun, srun, mpirun or --nproc
		return runRankProcess(ctx, cfg, info)
	case p.NProc > 0:
		return launchLocal(ctx, cfg, args)
	case p.Processes(): // a world of one process over tcp, nccl or nvshmem
		return runRankProcess(ctx, cfg, info)
	case !p.Single():
		return runParallel(ctx, cfg)
	}
	var ledger []cudabackend.Option
	if cfg.memReport {
		ledger = append(ledger, cudabackend.WithMemLedger())
	}
	b, dt, note, err := openBackend(cfg.Device, cfg.GroupedGEMM, ledger...)
	if err != nil {
		return err
	}
	fmt.Println("device:", note.line)
	if cfg.verbose && note.why != "" {
		fmt.Println("device: no GPU because:", note.why)
	}
	if _, ok := b.(*cudabackend.Backend); cfg.memReport && !ok {
		return fmt.Errorf("--memory-report: expected the CUDA backend (it reports the GPU allocator's blocks), found %s: %s", b.Name(), note.line)
	}

	ds, err := openDataset(cfg)
	if err != nil {
		return err
	}
	data, more, err := dataAndOptions(cfg, ds, true)
	if err != nil {
		return err
	}
	model, err := layers.NewGPT(b, cfg.Model, dt)
	if err != nil {
		return err
	}
	if err := initWeights(cfg, b, model.Params(), hf.Single); err != nil {
		return err
	}
	mc := model.Config()
	fmt.Println(modelLine(cfg.Preset, mc, model.Params().Numel()))
	fmt.Printf("data: %s, %d tokens; batch %d x %d, %d steps\n", data.Name(), data.Tokens(), cfg.Train.Batch, cfg.Train.Seq, cfg.Train.Steps)
	printResume(cfg)
	if mc.Experts > 0 {
		fmt.Println("moe: expert GEMMs", expertGEMMLine(cfg.GroupedGEMM, b.Name(), gptGEMMs(model)))
	}

	var lastVal any
	opts := append(more, train.WithModelConfig(mc), train.WithInterruptibleSteps(),
		train.WithStepHook(func(m train.StepMetrics) {
			if v, ok := m.Extra["val_loss"]; ok {
				lastVal = v
			}
		}))
	dump, err := openRoutingDump(cfg, 0, b, routing.GPTLayers(model))
	if err != nil {
		return err
	}
	if mc.Experts > 0 {
		opts = append(opts, train.WithLateExtraMetrics(dump.Then(func(int) func() (map[string]any, error) { return routerMetrics(model) })))
	}
	res, err := train.Run(ctx, b, model, data, cfg.Train, opts...)
	if err := errors.Join(err, dump.Close()); err != nil {
		return err
	}
	val := ""
	if v, ok := lastVal.(float64); ok {
		val = fmt.Sprintf(", validation loss %.4f (perplexity %.2f)", v, math.Exp(v))
	}
	fmt.Printf("done: step %d, loss %.4f%s, %.0f tokens/s; checkpoint %s\n", res.Step, res.FinalLoss, val, res.TokensPerSec, res.LastCheckpoint)
	if ms, ok := b.(interface{ MemStats() cudabackend.MemStats }); ok {
		// The allocator's high-water mark: what the device had to give this
		// process for tensors (torch.cuda.max_memory_reserved is the same measure).
		fmt.Printf("memory: peak %.2f GiB reserved from the device by the allocator\n", float64(ms.MemStats().Peak)/(1<<30))
	}
	if l, ok := b.(interface {
		MemLedger() (cudabackend.MemReport, bool)
	}); ok {
		if r, on := l.MemLedger(); on {
			r.Write(os.Stdout, true)
		}
	}
	return nil
}

// dataAndOptions opens --val-data, or cuts the held-out split off ds
// (train.val_fraction), and returns the training loader and the options of
// every rank's train.Run: the validation, what the token ids are, and on
// rank 0 (rank0) the start hook that writes OUT/config.json (and the
// tokenizer of --init-from) once the run is sure to start, so a resume
// that fails leaves them as they were.
func dataAndOptions(cfg Config, ds *tokens.Stream, rank0 bool) (*train.Loader, []train.Option, error) {
	tok, err := tokenizerOf(cfg, ds)
	if err != nil {
		return nil, nil, err
	}
	opts := []train.Option{train.WithTokenizer(tok, olderTokenizerNames[tok]...), train.WithRunConfig(cfg)}
	t := cfg.Train
	trainSet := ds
	switch {
	case cfg.ValData != "":
		val, _, err := openValidation(cfg, ds)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, train.WithValidation(val, t.EvalEvery, t.EvalBatches))
	case t.ValFraction > 0:
		var valSet *tokens.Stream
		if trainSet, valSet, err = train.SplitValidation(ds, t.ValFraction); err != nil {
			return nil, nil, err
		}
		lc := loaderConfig(cfg)
		lc.Sequential = true
		val, err := train.NewLoader(valSet, lc)
		switch n, need := valSet.Len(), int64(t.Seq+1); {
		case err != nil && 2*need > ds.Len():
			return nil, nil, fmt.Errorf("%s has %d tokens, too few to hold out a window of seq+1 = %d for validation and keep one to train on: give --val-fraction 0",
				ds.Name(), ds.Len(), need)
		case err != nil && n < need:
			return nil, nil, fmt.Errorf("the held-out split (the last %g of %s) has %d tokens, fewer than one window of seq+1 = %d: give --val-fraction %.2g or more, or 0 for none",
				t.ValFraction, ds.Name(), n, need, math.Ceil(100*float64(need)/float64(ds.Len()))/100)
		case err != nil:
			return nil, nil, fmt.Errorf("the held-out split (the last %g of the data, --val-fraction): %w", t.ValFraction, err)
		}
		opts = append(opts, train.WithValidation(val, t.EvalEvery, t.EvalBatches))
	}
	data, err := train.NewLoader(trainSet, loaderConfig(cfg))
	if err != nil {
		return nil, nil, err
	}
	if rank0 {
		opts = append(opts, train.WithStartHook(func(train.Result) error {
			if err := os.MkdirAll(cfg.Train.OutDir, 0o755); err != nil {
				return err
			}
			if err := copyTokenizer(cfg); err != nil {
				return err
			}
			return writeJSONAtomic(filepath.Join(cfg.Train.OutDir, "config.json"), cfg)
		}))
	}
	return data, opts, nil
}

// moeModel is what routerMetrics reads: layers.GPT and the sharded
// model.Model (whose statistics cover the global batch on every rank).
type moeModel interface {
	RouterStatsAsync() func() (float64, []layers.MoEStats, error)
}

// routerMetrics are the MoE fields of a metrics.jsonl record: the auxiliary
// loss (included in "loss") and, per MoE block, the token-slots each expert
// received and how many were dropped over capacity. They are the last
// forward's, given by the returned function: on the MoE device step their
// read is waited for then, with the step's loss, one step late
// (train.WithLateExtraMetrics).
func routerMetrics(m moeModel) func() (map[string]any, error) {
	read := m.RouterStatsAsync()
	return func() (map[string]any, error) {
		aux, stats, err := read()
		if err != nil {
			return nil, err
		}
		var perExpert [][]int
		dropped := 0
		for _, s := range stats {
			perExpert = append(perExpert, s.TokensPerExpert)
			dropped += s.Dropped
		}
		return map[string]any{"aux_loss": aux, "tokens_per_expert": perExpert, "dropped": dropped}, nil
	}
}

// openDataset opens --data in --data-format (the files are mapped, not
// read: see package tokens), or the built-in corpus when none is
// given, and checks --val-data, so that the errors of both come before any
// rank starts.
func openDataset(cfg Config) (*tokens.Stream, error) {
	ds := tokens.FromBytes("built-in corpus", corpus.Default())
	if cfg.Data != "" {
		var err error
		if ds, err = tokens.Open(cfg.Data, tokens.Format(cfg.DataFormat)); err != nil {
			return nil, dataError("--data", err)
		}
	}
	if cfg.ValData != "" {
		_, vs, err := openValidation(cfg, ds)
		if err != nil {
			ds.Close()
			return nil, err
		}
		vs.Close()
	}
	return ds, nil
}

// dataError is err of opening the files of flag (--data, --val-data), with
// the flag that reads them where a format given explicitly would
// (tokens.ErrMixedKinds, tokens.ErrLLMCVersion).
func dataError(flag string, err error) error {
	switch {
	case errors.Is(err, tokens.ErrMixedKinds):
		return fmt.Errorf("%s: %w; give it with --data-format", flag, err)
	case errors.Is(err, tokens.ErrLLMCVersion):
		return fmt.Errorf("%s: %w; give it with --data-format uint16 or uint32", flag, err)
	}
	return fmt.Errorf("%s: %w", flag, err)
}

// openValidation is the loader of --val-data, whose ids must be of the
// kind of ds's (text, or token ids), and its dataset.
func openValidation(cfg Config, ds *tokens.Stream) (*train.Loader, *tokens.Stream, error) {
	vs, err := tokens.Open(cfg.ValData, tokens.Format(cfg.DataFormat))
	if err != nil {
		return nil, nil, dataError("--val-data", err)
	}
	if kind := func(s *tokens.Stream) string {
		if s.Text() {
			return "text (one token per byte)"
		}
		return "token ids"
	}; vs.Text() != ds.Text() {
		vs.Close()
		return nil, nil, fmt.Errorf("--val-data %s holds %s, but the training data %s holds %s: validate on data of the training data's kind", vs.Name(), kind(vs), ds.Name(), kind(ds))
	}
	lc := loaderConfig(cfg)
	lc.Sequential = true
	val, err := train.NewLoader(vs, lc)
	if err != nil {
		vs.Close()
		return nil, nil, fmt.Errorf("--val-data: %w", err)
	}
	return val, vs, nil
}

// loaderConfig is the loader of the run's batches (every rank of a
// parallel run reads the same global batches).
func loaderConfig(cfg Config) train.LoaderConfig {
	return train.LoaderConfig{Batch: cfg.Train.Batch, Seq: cfg.Train.Seq, Vocab: cfg.Model.Vocab, Seed: cfg.Train.Seed}
}

// writeJSONAtomic writes v as indented JSON through a temporary file and a
// rename, so a crash never leaves a half-written file in place.
func writeJSONAtomic(path string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return train.WriteFileAtomic(path, append(js, '\n'))
}

// modelLine is the start's line on the model: its preset and sizes, the
// key/value heads when they are fewer than the heads (grouped-query
// attention), and its parameters.
func modelLine(preset string, mc layers.GPTConfig, params int) string {
	mc = mc.WithDefaults()
	heads := fmt.Sprintf("%d heads", mc.Heads)
	if mc.KVHeads != mc.Heads {
		heads += fmt.Sprintf(" (%d key/value)", mc.KVHeads)
	}
	return fmt.Sprintf("model: %s, %d layers, width %d, %s, vocab %d, seq %d, %.2fM parameters",
		preset, mc.Layers, mc.Dim, heads, mc.Vocab, mc.Seq, float64(params)/1e6)
}
