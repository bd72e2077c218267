package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"

	"github.com/asynctp/asynctp/tensor"
)

// Sharded is what RunSharded needs of one rank's part of a model sharded
// over ranks (parallel/model.Model has it): the Model, its world rank, its
// layout L (recorded in every checkpoint's state.json and compared on
// resume), and an agreement over the world on the checkpoint step.
type Sharded[L comparable] interface {
	Model
	// WorldRank is this rank's index in the world.
	WorldRank() int
	// Layout says how this rank's tensors are sharded.
	Layout() L
	// StepRange returns the maximum and minimum of step over the world; a
	// collective: every rank calls it with its own step.
	StepRange(step int) (hi, lo int, err error)
}

// RankDir is where world rank rank keeps its checkpoints under the run's
// out dir: outDir/rank-00001.
func RankDir(outDir string, rank int) string {
	return filepath.Join(outDir, fmt.Sprintf("rank-%05d", rank))
}

// RunSharded trains m with Run on this rank; every rank of the world calls
// it with the same backend kind, data, config and options. data yields the
// global batch (cfg.Batch sequences, the same on every rank); m takes its
// replica's rows.
//
// Each rank saves its own shards and their AdamW moments: its checkpoints
// go to RankDir(cfg.OutDir, rank), and each state.json records the rank's
// Layout. Only world rank 0 prints progress and writes metrics.jsonl and
// loss.png, in cfg.OutDir itself (opts may change that):
//
//	outDir/metrics.jsonl, loss.png      world rank 0
//	outDir/rank-00000/step-000100/...   each rank's shards and moments
//	outDir/rank-00001/...
//
// A resume at the same layout continues exactly: cfg.Resume names the
// run's out dir (what cfg.OutDir was), and every rank resumes from the
// latest checkpoint of its rank dir, after checking that the checkpoint
// was written with this layout and that all ranks resume from the same
// step. When the ranks' latest checkpoints differ (a rank died between
// its peers' checkpoints of a step), every rank resumes from the newest
// step that all of them hold, if they do.
func RunSharded[L comparable](ctx context.Context, b tensor.Backend, m Sharded[L], data *Loader, cfg Config, opts ...Option) (Result, error) {
	if b == nil || m == nil {
		return Result{}, errors.New("train: RunSharded needs a backend and a model")
	}
	cfg = cfg.WithDefaults()
	rank := m.WorldRank()
	base := []Option{WithRank0(true), WithLayout(m.Layout()), WithMetricsDir(cfg.OutDir)}
	if rank != 0 {
		base = append(base, WithOutput(io.Discard), WithProgressBar(false), WithMetricsDir(""))
	}
	cfg.OutDir = RankDir(cfg.OutDir, rank)
	if cfg.Resume != "" {
		ck, err := checkShardedResume(b, m, RankDir(cfg.Resume, rank))
		if err != nil {
			return Result{}, err
		}
		cfg.Resume = ck
	}
	return Run(ctx, b, m, data, cfg, append(base, opts...)...)
}

// checkShardedResume checks, collectively over the world, that every
// rank's checkpoint under dir has this rank's layout and that all are at
// the same step, and returns the checkpoint this rank resumes from. Every
// rank takes part even when its own check fails, so none waits. When the
// ranks' latest checkpoints are at different steps, the newest step that
// every rank holds (the lowest of the latest ones) is taken, if every rank
// holds a valid checkpoint of it.
func checkShardedResume[L comparable](b tensor.Backend, m Sharded[L], dir string) (string, error) {
	step, ck, localErr := -1, "", error(nil)
	if ck, localErr = ResolveCheckpoint(dir); localErr == nil {
		step, localErr = shardedCheckpointStep(m, ck)
	}
	// Max and min of the steps over the world (−1 marks a failed rank).
	hi, lo, err := m.StepRange(step)
	if err != nil {
		return "", fmt.Errorf("train: resume: agreeing on the step: %w", err)
	}
	if localErr != nil {
		return "", localErr
	}
	if lo < 0 {
		return "", fmt.Errorf("train: resume from %s: another rank has no usable checkpoint (this rank is at step %d)", dir, step)
	}
	if hi == lo {
		return ck, backendErr(b)
	}
	// Fall back to step lo, the newest that every rank may hold.
	older := filepath.Join(dir, CheckpointName(lo))
	have := lo
	if got, err := shardedCheckpointStep(m, older); err != nil || got != lo {
		have = -1
	}
	_, lowest, err := m.StepRange(have)
	if err != nil {
		return "", fmt.Errorf("train: resume: agreeing on the step: %w", err)
	}
	if lowest != lo {
		return "", fmt.Errorf("train: resume from %s: the ranks' latest checkpoints are at steps %d to %d, and not every rank holds step %d (this rank: %d)", dir, lo, hi, lo, step)
	}
	return older, backendErr(b)
}

// shardedCheckpointStep reads the step of checkpoint ck after checking its
// layout.
func shardedCheckpointStep[L comparable](m Sharded[L], ck string) (int, error) {
	st, err := ReadState(filepath.Join(ck, StateFile))
	if err != nil {
		return -1, err
	}
	var got L
	want := m.Layout()
	switch {
	case len(st.Layout) == 0:
		return -1, fmt.Errorf("train: resume from %s: the checkpoint records no layout, expected %+v", ck, want)
	case json.Unmarshal(st.Layout, &got) != nil || got != want:
		return -1, fmt.Errorf("train: resume from %s: the checkpoint was written with layout %s, this rank runs %+v", ck, st.Layout, want)
	}
	return st.Step, nil
}

func backendErr(b tensor.Backend) error {
	if err := b.Err(); err != nil {
		return fmt.Errorf("train: resume: %w", err)
	}
	return nil
}
