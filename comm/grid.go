package comm

import (
	"errors"
	"fmt"
)

// Grid carves the groups of a training run from the world. With world size
// W = DP·TP, world rank r has coordinates
//
//	tp rank = r % TP, dp rank = r / TP
//
// so a TP group is TP consecutive ranks (they share a node and its fastest
// links) and a DP group is the ranks with the same tp rank, strided by TP.
//
// Expert parallelism is laid over the same world independently: EP must
// divide W, and an EP group is EP consecutive ranks (ep rank = r % EP, group
// r / EP), the ranks that shard the experts of an MoE layer between them.
// The EDP ("expert data parallel") group of a rank is the ranks holding the
// same experts, strided by EP (r % EP equal): expert gradients are reduced
// over EDP, the other gradients over DP. With EP = TP the EP groups are the
// TP groups; with EP = W there is one EP group and each EDP group is a single
// rank. EP = 1 puts every expert on every rank (EDP = world).
//
// Groups are plain values passed to the layers that need them; nothing is
// global. The Grid owns its groups (not the world): Close closes them.
type Grid struct {
	World  Comm // every rank of the job
	DP, TP int  // data- and tensor-parallel sizes, DP·TP = World.Size()
	EP     int  // expert-parallel size, divides World.Size()

	TPGroup  Comm // "tp": ranks with the same r / TP, ordered by r
	DPGroup  Comm // "dp": ranks with the same r % TP, ordered by r
	EPGroup  Comm // "ep": ranks with the same r / EP, ordered by r
	EDPGroup Comm // "edp": ranks with the same r % EP, ordered by r
}

// NewGrid splits world into its TP, DP, EP and EDP groups (see Grid). It is
// collective over world: every rank calls it with the same sizes.
func NewGrid(world Comm, dp, tp, ep int) (*Grid, error) {
	w := world.Size()
	if dp < 1 || tp < 1 || dp*tp != w {
		return nil, Errorf(world, "grid", "dp %d × tp %d: expected positive sizes whose product is the world size %d", dp, tp, w)
	}
	if ep < 1 || w%ep != 0 {
		return nil, Errorf(world, "grid", "ep %d: expected a positive divisor of the world size %d", ep, w)
	}
	g := &Grid{World: world, DP: dp, TP: tp, EP: ep}
	r := world.Rank()
	for _, s := range []struct {
		dst   *Comm
		color int
		label string
	}{
		{&g.TPGroup, r / tp, "tp"},
		{&g.DPGroup, r % tp, "dp"},
		{&g.EPGroup, r / ep, "ep"},
		{&g.EDPGroup, r % ep, "edp"},
	} {
		c, err := SplitNamed(world, s.color, r, s.label)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("comm: grid dp %d × tp %d, ep %d: %s group: %w", dp, tp, ep, s.label, err)
		}
		*s.dst = c
	}
	return g, nil
}

// Close closes the groups of the grid (not the world).
func (g *Grid) Close() error {
	var errs []error
	for _, c := range []*Comm{&g.TPGroup, &g.DPGroup, &g.EPGroup, &g.EDPGroup} {
		if *c != nil {
			errs = append(errs, (*c).Close())
			*c = nil
		}
	}
	return errors.Join(errs...)
}
