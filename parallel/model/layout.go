package model

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train"
)

// Layout says how a rank's tensors are sharded: recorded in every
// checkpoint's state.json (train.WithLayout) and checked on resume.
type Layout struct {
	TP               int  `json:"tp"`
	DP               int  `json:"dp"`
	EP               int  `json:"ep"`
	SequenceParallel bool `json:"sequence_parallel"`
	Rank             int  `json:"rank"` // world rank
	TPRank           int  `json:"tp_rank"`
	DPRank           int  `json:"dp_rank"`
	World            int  `json:"world"`
}

// Layout returns this rank's layout.
func (m *Model) Layout() Layout {
	g := m.grid
	return Layout{TP: g.TP, DP: g.DP, EP: g.EP, SequenceParallel: m.par.SequenceParallel,
		Rank: g.World.Rank(), TPRank: g.TPGroup.Rank(), DPRank: g.DPGroup.Rank(), World: g.World.Size()}
}

// RankDir is where world rank rank keeps its checkpoints and metrics under
// the run's out dir: outDir/rank-00001.
func RankDir(outDir string, rank int) string {
	return filepath.Join(outDir, fmt.Sprintf("rank-%05d", rank))
}

// Run trains m with train.Run on this rank; every rank of the grid calls it
// with the same data, config and options. data yields the global batch
// (cfg.Batch sequences, the same on every rank); m takes its replica's
// rows.
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
// step that all of them hold, if they do. The gradient norm for clipping
// comes from Model.GradSumSquares.
func Run(ctx context.Context, m *Model, data *train.Loader, cfg train.Config, opts ...train.Option) (train.Result, error) {
	cfg = cfg.WithDefaults()
	rank := m.grid.World.Rank()
	base := []train.Option{train.WithRank0(true), train.WithLayout(m.Layout()), train.WithMetricsDir(cfg.OutDir)}
	if rank != 0 {
		base = append(base, train.WithOutput(io.Discard), train.WithProgressBar(false), train.WithMetricsDir(""))
	}
	cfg.OutDir = RankDir(cfg.OutDir, rank)
	if cfg.Resume != "" {
		ck, err := m.checkResume(RankDir(cfg.Resume, rank))
		if err != nil {
			return train.Result{}, err
		}
		cfg.Resume = ck
	}
	return train.Run(ctx, m.b, m, data, cfg, append(base, opts...)...)
}

// checkResume checks, collectively over the world, that every rank's
// checkpoint under dir has this rank's layout and that all are at the same
// step, and returns the checkpoint this rank resumes from. Every rank takes
// part even when its own check fails, so none waits. When the ranks'
// latest checkpoints are at different steps, the newest step that every
// rank holds (the lowest of the latest ones) is taken, if every rank holds
// a valid checkpoint of it.
func (m *Model) checkResume(dir string) (string, error) {
	step, ck, localErr := -1, "", error(nil)
	if ck, localErr = train.ResolveCheckpoint(dir); localErr == nil {
		step, localErr = m.checkpointStep(ck)
	}
	// Max and min of the steps over the world (−1 marks a failed rank).
	hi, lo, err := m.stepRange(step)
	if err != nil {
		return "", fmt.Errorf("model: resume: agreeing on the step: %w", err)
	}
	if localErr != nil {
		return "", localErr
	}
	if lo < 0 {
		return "", fmt.Errorf("model: resume from %s: another rank has no usable checkpoint (this rank is at step %d)", dir, step)
	}
	if hi == lo {
		return ck, sticky(m.b, "resume")
	}
	// Fall back to step lo, the newest that every rank may hold.
	older := filepath.Join(dir, train.CheckpointName(lo))
	have := lo
	if got, err := m.checkpointStep(older); err != nil || got != lo {
		have = -1
	}
	_, lowest, err := m.stepRange(have)
	if err != nil {
		return "", fmt.Errorf("model: resume: agreeing on the step: %w", err)
	}
	if lowest != lo {
		return "", fmt.Errorf("model: resume from %s: the ranks' latest checkpoints are at steps %d to %d, and not every rank holds step %d (this rank: %d)", dir, lo, hi, lo, step)
	}
	return older, sticky(m.b, "resume")
}

// checkpointStep reads the step of checkpoint ck after checking its layout.
func (m *Model) checkpointStep(ck string) (int, error) {
	st, err := train.ReadState(filepath.Join(ck, train.StateFile))
	if err != nil {
		return -1, err
	}
	var got Layout
	want := m.Layout()
	switch {
	case len(st.Layout) == 0:
		return -1, fmt.Errorf("model: resume from %s: the checkpoint records no layout, expected %+v", ck, want)
	case json.Unmarshal(st.Layout, &got) != nil || got != want:
		return -1, fmt.Errorf("model: resume from %s: the checkpoint was written with layout %s, this rank runs %+v", ck, st.Layout, want)
	}
	return st.Step, nil
}

// stepRange returns the maximum and minimum of step over the world.
func (m *Model) stepRange(step int) (hi, lo int, err error) {
	b, s := m.b, m.par.Stream
	buf := b.Zeros(layers.StatDType(m.dt), 2)
	defer b.Free(buf)
	h := tensor.MustHost(tensor.Float64, 2)
	h.F64()[0], h.F64()[1] = float64(step), -float64(step)
	b.Upload(buf, h)
	w, err := m.grid.World.AllReduce(buf, comm.Max, s)
	if err == nil {
		err = w.Wait(s)
	}
	if err != nil {
		return 0, 0, err
	}
	b.Download(h, buf)
	return int(h.F64()[0]), int(-h.F64()[1]), nil
}
