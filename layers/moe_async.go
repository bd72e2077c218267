package layers

// StatsReader is an optional interface of a feed-forward layer whose
// auxiliary loss and routing statistics may still be on the device after
// its Forward (parallel/ep's MoE on the device step): StatsAsync returns a
// function that gives what Stats (and AuxLoss, its AuxLoss field) return
// now, waiting for their read then rather than now. Later forwards do not
// change what it returns, so a training loop can queue the next step
// before it asks. The function may be called more than once.
type StatsReader interface {
	// StatsAsync returns the function that gives the statistics.
	StatsAsync() func() (MoEStats, error)
}

// statsAsync is AuxLoss and Stats of the block's last Forward, read when
// the returned function is called (StatsReader) or taken now.
func (blk *Block) statsAsync() func() (aux float64, st MoEStats, moe bool, err error) {
	if r, ok := blk.FFN.(StatsReader); ok {
		read := r.StatsAsync()
		return func() (float64, MoEStats, bool, error) {
			st, err := read()
			return st.AuxLoss, st, true, err
		}
	}
	aux := blk.AuxLoss()
	st, moe := blk.Stats()
	return func() (float64, MoEStats, bool, error) { return aux, st, moe, nil }
}

// RouterStatsAsync is AuxLoss and RouterStats of the last Forward, given
// by the returned function: the MoE blocks' values still on the device
// (StatsReader) are waited for only then, so it takes no host sync now,
// and later forwards do not change what it returns. It sums the blocks'
// auxiliary losses in the order AuxLoss does (the same value). The
// function may be called more than once.
//
// After a ForwardBackward it gives the statistics of the step's
// micro-batches combined: the auxiliary loss their mean, each block's
// MoEStats combined over them (MoEStats.Combine).
func (d *Decoder) RouterStatsAsync() func() (aux float64, stats []MoEStats, err error) {
	if d.steps != nil {
		return combineSteps(d.steps)
	}
	read := d.blocksStatsAsync()
	return func() (float64, []MoEStats, error) {
		aux, stats, _, err := read()
		return aux, stats, err
	}
}

// blocksStatsAsync is RouterStatsAsync of the blocks' last forward, with a
// flag that says whether any block is an MoE block.
func (d *Decoder) blocksStatsAsync() func() (float64, []MoEStats, bool, error) {
	reads := make([]func() (float64, MoEStats, bool, error), len(d.p.Blocks))
	for i, blk := range d.p.Blocks {
		reads[i] = blk.statsAsync()
	}
	return func() (float64, []MoEStats, bool, error) {
		var aux float64
		var stats []MoEStats
		any := false
		for _, read := range reads {
			a, st, moe, err := read()
			if err != nil {
				return 0, nil, false, err
			}
			aux += a
			if moe {
				stats = append(stats, st)
				any = true
			}
		}
		return aux, stats, any, nil
	}
}
