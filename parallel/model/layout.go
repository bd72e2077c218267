package model

import (
	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
	"github.com/asynctp/asynctp/internal/layerkit"
)

// Layout says how a rank's tensors are sharded: recorded in every
// checkpoint's state.json (train.RunSharded) and checked on resume.
type Layout struct {
	TP               int  `json:"tp"`
	DP               int  `json:"dp"`
	EP               int  `json:"ep"`
	SequenceParallel bool `json:"sequence_parallel"`
	Rank             int  `json:"rank"` // world rank
	TPRank           int  `json:"tp_rank"`
	DPRank           int  `json:"dp_rank"`
	World            int  `json:"world"`
	// DistributedOptimizer: the optimizer's state is sharded over the DP
	// (EDP) group (Options.DistributedOptimizer).
	DistributedOptimizer bool `json:"distributed_optimizer,omitempty"`
}

// Layout returns this rank's layout.
func (m *Model) Layout() Layout {
	g := m.grid
	return Layout{TP: g.TP, DP: g.DP, EP: g.EP, SequenceParallel: m.par.SequenceParallel,
		Rank: g.World.Rank(), TPRank: g.TPGroup.Rank(), DPRank: g.DPGroup.Rank(), World: g.World.Size(),
		DistributedOptimizer: m.distOpt}
}

// WorldRank is this rank's index in the grid's world.
func (m *Model) WorldRank() int { return m.grid.World.Rank() }

// WorldSize is the number of ranks of the grid's world: with Shards, it
// makes the Model a train.Resharder, whose checkpoints resume at any
// layout.
func (m *Model) WorldSize() int { return m.grid.World.Size() }

// StepRange returns the maximum and minimum of step over the world, a
// collective over the grid's world: train.RunSharded agrees with it on the
// checkpoint every rank resumes from.
func (m *Model) StepRange(step int) (hi, lo int, err error) {
	v := []float64{float64(step), -float64(step)}
	if err := hostreduce.AllReduce(m.b, m.grid.World, layerkit.StatDType(m.dt), v, comm.Max, m.par.Stream); err != nil {
		return 0, 0, err
	}
	return int(v[0]), int(-v[1]), nil
}
