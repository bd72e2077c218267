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
	if rs, ok := any(m).(Resharder); ok {
		base = append(base, func(o *runOptions) { o.ranks = rs.WorldSize() })
	}
	cfg.OutDir = RankDir(cfg.OutDir, rank)
	if cfg.Resume != "" {
		ck, from, err := shardedResume(b, m, cfg.Resume)
		if err != nil {
			return Result{}, err
		}
		cfg.Resume = ck
		if from != nil {
			cfg.Resume = from[0]
			base = append(base, func(o *runOptions) { o.reshardFrom = from })
		}
	}
	return Run(ctx, b, m, data, cfg, append(base, opts...)...)
}

// How a sharded run resumes (shardedResume), agreed over the world.
const (
	resumeFailed  = -1 // this rank cannot read the run's checkpoints
	resumeFormat1 = 0  // checkpoints of format 1: each rank its own, at the same layout only
	resumeReshard = 1  // from the checkpoints of another layout
	resumeSame    = 2  // each rank from its own checkpoint of the same layout and step
)

// shardedResume decides, collectively over the world, how each rank
// resumes from the run in dir (RunCheckpoints: the newest step every rank
// of that run holds): from its own checkpoint when the run's layout is
// this one (ck), else from every rank's of the run (from), resharded;
// checkpoints of format 1 by the rule of their time (checkShardedResume).
// Every rank takes part even when its own reading fails, so none waits.
func shardedResume[L comparable](b tensor.Backend, m Sharded[L], dir string) (ck string, from []string, err error) {
	rank := m.WorldRank()
	cks, rerr := RunCheckpoints(dir)
	how, step := resumeFailed, -1
	switch {
	case errors.Is(rerr, errNoRanks):
		how = resumeFormat1
	case rerr == nil:
		how = resumeReshard
		if st, err := ReadState(filepath.Join(cks[0], StateFile)); err == nil {
			step = st.Step
		}
		world := len(cks)
		if rs, ok := any(m).(Resharder); ok {
			world = rs.WorldSize()
		}
		if rank < len(cks) && world == len(cks) {
			if _, err := shardedCheckpointStep(m, cks[rank]); err == nil {
				how = resumeSame
			}
		}
	}
	hi, lo, err := m.StepRange(how)
	if err != nil {
		return "", nil, fmt.Errorf("train: resume: agreeing on how: %w", err)
	}
	if how == resumeFormat1 && hi == lo {
		ck, err := checkShardedResume(b, m, RankDir(dir, rank))
		return ck, nil, err
	}
	if how != resumeFailed && hi == lo {
		// The same checkpoints on every rank: the same step.
		shi, slo, err := m.StepRange(step)
		switch {
		case err != nil:
			return "", nil, fmt.Errorf("train: resume: agreeing on the step: %w", err)
		case shi != slo:
			return "", nil, fmt.Errorf("train: resume from %s: the ranks found checkpoints of steps %d to %d", dir, slo, shi)
		case how == resumeSame:
			return cks[rank], nil, backendErr(b)
		}
		return "", cks, backendErr(b)
	}
	switch {
	case rerr != nil && how == resumeFailed:
		return "", nil, rerr
	case lo == resumeFailed:
		return "", nil, fmt.Errorf("train: resume from %s: another rank cannot read the run's checkpoints", dir)
	case lo == resumeFormat1 || hi == resumeFormat1:
		return "", nil, fmt.Errorf("train: resume from %s: the ranks found checkpoints of different formats", dir)
	}
	return "", nil, fmt.Errorf("train: resume from %s: its checkpoints have this layout on some ranks and not on others (this rank: %v)", dir, how == resumeSame)
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
