package main

import (
	"fmt"
	"time"
)

// noEffect is a config field that some runs cannot use: given for such a
// run it is refused, naming it, rather than silently ignored.
type noEffect struct {
	flag  string                         // the flag (trainFlags; its first config path is the field's)
	idle  func(c *Config, l origin) bool // whether the run (started as l) cannot use it
	value func(c *Config) any            // the field's value
	why   func(c *Config) string         // why it cannot take effect
}

// key is the config field ("section.json_name") the flag sets.
func (f noEffect) key() string { return flagPaths[f.flag][0] }

var noEffects = []noEffect{
	moeOnly("topk", func(c *Config) any { return c.Model.TopK }),
	moeOnly("moe-every", func(c *Config) any { return c.Model.MoEEvery }),
	moeOnly("capacity-factor", func(c *Config) any { return c.Model.CapacityFactor }),
	moeOnly("aux-loss-coef", func(c *Config) any { return c.Model.AuxLossCoef }),
	moeOnly("z-loss-coef", func(c *Config) any { return c.Model.ZLossCoef }),
	evalOnly("eval-every", func(c *Config) any { return c.Train.EvalEvery }),
	evalOnly("eval-batches", func(c *Config) any { return c.Train.EvalBatches }),
	{flag: "autotune-cache", value: func(c *Config) any { return c.AutotuneCache },
		idle: func(c *Config, _ origin) bool { return !usesAuto(c.Overlap) },
		why:  func(*Config) string { return "only --overlap auto (or a site configured \"auto\") reads the cache" }},
	{flag: "comm-timeout", value: func(c *Config) any { return time.Duration(c.Parallel.CommTimeout) },
		idle: func(c *Config, l origin) bool { return oneRank(c.Parallel, l) },
		why:  func(*Config) string { return "a run of one rank in one process waits for no other rank" }},
	{flag: "grad-reduce-dtype", value: func(c *Config) any { return orFP32(c.Parallel.GradReduceDType) },
		idle: func(c *Config, l origin) bool { return oneRank(c.Parallel, l) },
		why:  func(*Config) string { return "a run of one rank sums no gradients over other ranks" }},
	{flag: "distributed-optimizer", value: func(c *Config) any { return c.Parallel.DistributedOptimizer },
		idle: func(c *Config, l origin) bool { return c.Parallel.DistributedOptimizer && noReplicas(c, l) },
		why: func(*Config) string {
			return "the optimizer's state is sharded over data-parallel replicas (and over the ranks holding the same experts), and this run has none: give --dp > 1, or leave it out"
		}},
	{flag: "grad-bucket-mb", value: func(c *Config) any { return c.Parallel.GradBucketMB },
		idle: noReplicas, why: noReplicasWhy},
	{flag: "overlap-grad-reduce", value: func(c *Config) any { return c.Parallel.OverlapGradReduce == nil || *c.Parallel.OverlapGradReduce },
		idle: noReplicas, why: noReplicasWhy},
}

// noReplicas reports whether no gradient is summed over replicas in
// buckets: one data-parallel replica, and no expert weights held by more
// than one rank (a dense model, or EP = the world).
func noReplicas(c *Config, _ origin) bool {
	p := c.Parallel
	return p.DP <= 1 && (c.Model.Experts == 0 || p.EP >= p.World)
}

func noReplicasWhy(*Config) string {
	return "the buckets hold the sums over data-parallel replicas (and over the ranks holding the same experts), and this run has none: give --dp > 1, or leave it out"
}

// oneRank reports whether the run is one rank in one process: no
// launcher, no --nproc, no transport between processes, every size 1.
func oneRank(p ParallelConfig, l origin) bool {
	return !l.launched && p.NProc == 0 && (p.Comm == "" || p.Comm == CommLocal) &&
		p.TP == 1 && p.DP == 1 && p.EP == 1 && p.World <= 1
}

// moeOnly is a field only an MoE model uses. A run that resumes or starts
// from a model directory takes the model from there (prepare), so the
// check waits for that model only when there is none.
func moeOnly(flag string, value func(c *Config) any) noEffect {
	return noEffect{flag: flag, value: value,
		idle: func(c *Config, _ origin) bool {
			return c.Model.Experts == 0 && c.Train.Resume == "" && c.InitFrom == ""
		},
		why: func(*Config) string {
			return "the model is dense (model.experts 0, --experts): give --experts N for an MoE model, or leave it out"
		}}
}

// evalOnly is a field only the evaluation uses: on the held-out split, or
// on --val-data.
func evalOnly(flag string, value func(c *Config) any) noEffect {
	return noEffect{flag: flag, value: value,
		idle: func(c *Config, _ origin) bool { return c.Train.ValFraction == 0 && c.ValData == "" },
		why: func(*Config) string {
			return "nothing is held out (train.val_fraction 0, --val-fraction) and there is no --val-data: give a fraction or a validation set, or leave it out"
		}}
}

// checkTakesEffect refuses a field given explicitly that the run cannot
// use: by a flag (flags), or by the file with a value other than the
// preset's (preset): a file may repeat the preset's value, as the
// config.json a run writes does for every field.
func (c *Config) checkTakesEffect(flags map[string]bool, preset *Config, file string, l origin) error {
	for _, f := range noEffects {
		if !f.idle(c, l) {
			continue
		}
		switch {
		case flags[f.flag]:
			return fmt.Errorf("--%s %v cannot take effect: %s", f.flag, f.value(c), f.why(c))
		case c.explicit[f.key()] && f.value(c) != f.value(preset):
			return fmt.Errorf("config %s: %s %v cannot take effect: %s", file, f.key(), f.value(c), f.why(c))
		}
	}
	return nil
}

// checkSeq refuses a train.seq in the file (fileCfg, before the flags)
// that differs from the model's sequence length: the run's sequences are
// always the model's (model.seq, --seq).
func checkSeq(fileCfg *Config, named map[string]bool, file string) error {
	if named["train.seq"] && fileCfg.Train.Seq != fileCfg.Model.Seq {
		return fmt.Errorf("config %s: train.seq %d cannot take effect: the sequences are the model's, model.seq %d (--seq); set model.seq, or leave train.seq out",
			file, fileCfg.Train.Seq, fileCfg.Model.Seq)
	}
	return nil
}
