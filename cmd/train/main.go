// Command train trains a GPT model. With no flags it trains the tiny preset
// on the built-in corpus on the CPU; see README.md and -help.
//
// A parallel layout (--tp, --dp, --ep) runs its ranks as goroutines of this
// process (--comm local, parallel.go) or as processes (--comm tcp, nccl,
// nvshmem; rank.go): started by --nproc's own launcher (launch.go), or by
// torchrun, srun or mpirun, whose variables make this process one rank.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/asynctp/asynctp/internal/corpus"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/train"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	default:
		fmt.Fprintln(os.Stderr, "train:", err)
		os.Exit(1)
	}
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
	if cfg.Train.Resume != "" {
		if err := checkResume(cfg.Parallel, cfg.Train.Resume); err != nil {
			return err
		}
	}
	if err := checkOverlap(cfg); err != nil {
		return err
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
	b, dt, note, err := openBackend(cfg.Device)
	if err != nil {
		return err
	}
	fmt.Println("device:", note)

	data, err := openData(cfg)
	if err != nil {
		return err
	}
	model, err := layers.NewGPT(b, cfg.Model, dt)
	if err != nil {
		return err
	}
	mc := model.Config()
	fmt.Printf("model: %s, %d layers, width %d, %d heads, vocab %d, seq %d, %.2fM parameters\n",
		cfg.Preset, mc.Layers, mc.Dim, mc.Heads, mc.Vocab, mc.Seq, float64(model.Params().Numel())/1e6)
	fmt.Printf("data: %s, %d tokens; batch %d x %d, %d steps\n", data.Name(), data.Tokens(), cfg.Train.Batch, cfg.Train.Seq, cfg.Train.Steps)

	if err := os.MkdirAll(cfg.Train.OutDir, 0o755); err != nil {
		return err
	}
	if err := writeJSONAtomic(filepath.Join(cfg.Train.OutDir, "config.json"), cfg); err != nil {
		return err
	}
	opts := []train.Option{train.WithModelConfig(mc)}
	if mc.Experts > 0 {
		opts = append(opts, train.WithExtraMetrics(func(int) map[string]any { return routerMetrics(model) }))
	}
	res, err := train.Run(ctx, b, model, data, cfg.Train, opts...)
	if err != nil {
		return err
	}
	fmt.Printf("done: step %d, loss %.4f, %.0f tokens/s; checkpoint %s\n", res.Step, res.FinalLoss, res.TokensPerSec, res.LastCheckpoint)
	return nil
}

// moeModel is what routerMetrics reads: layers.GPT and the sharded
// model.Model (whose statistics cover the global batch on every rank).
type moeModel interface {
	AuxLoss() float64
	RouterStats() []layers.MoEStats
}

// routerMetrics are the MoE fields of a metrics.jsonl record: the auxiliary
// loss (included in "loss") and, per MoE block, the token-slots each expert
// received and how many were dropped over capacity.
func routerMetrics(m moeModel) map[string]any {
	var perExpert [][]int
	dropped := 0
	for _, s := range m.RouterStats() {
		perExpert = append(perExpert, s.TokensPerExpert)
		dropped += s.Dropped
	}
	return map[string]any{"aux_loss": m.AuxLoss(), "tokens_per_expert": perExpert, "dropped": dropped}
}

// openData opens --data, or the built-in corpus when none is given.
func openData(cfg Config) (*train.Loader, error) {
	ds, err := openDataset(cfg)
	if err != nil {
		return nil, err
	}
	return train.NewLoader(ds, loaderConfig(cfg))
}

// openDataset reads --data, or the built-in corpus when none is given.
func openDataset(cfg Config) (*train.Dataset, error) {
	if cfg.Data != "" {
		return train.ReadDataset(cfg.Data)
	}
	return train.BytesDataset("built-in corpus", corpus.Default())
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
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(js, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
