package train

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/layers"

	"github.com/asynctp/asynctp/optim"
)

// Config holds the knobs of a training run. The zero value of a field means
// "use the default" where zero makes no sense (see WithDefaults); for
// WeightDecay, MinLR, Warmup, GradClip, CheckpointEvery, KeepCheckpoints,
// EvalEvery and EvalBatches zero is a real setting (off / none / keep all).
// Beta1 = 0 is a real setting too (no momentum, legal in PyTorch) whenever
// Beta2 or Eps is set; only when all three are zero does the optimizer
// block take the defaults.
type Config struct {
	Steps int `json:"steps"` // total optimizer steps of the run (the last step's number)
	Batch int `json:"batch"` // sequences per step (B): the global batch, over all replicas
	Seq   int `json:"seq"`   // tokens per sequence (T)
	// MicroBatch is the sequences of one forward per data-parallel
	// replica: a step runs Batch / (MicroBatch × DP) micro-batches whose
	// gradients add up (gradient accumulation), Batch = MicroBatch ×
	// accumulation steps × DP. 0: Batch / DP (one forward per step).
	MicroBatch int `json:"micro_batch,omitempty"`
	// Recompute is the activation recompute of the model's blocks
	// (layers.Recompute's names: none, attention, block); "" is none.
	Recompute string `json:"recompute,omitempty"`

	LR          float64 `json:"lr"`           // peak learning rate, reached at the end of warm-up
	MinLR       float64 `json:"min_lr"`       // learning rate at the last step (cosine decay target)
	Warmup      int     `json:"warmup"`       // steps of linear warm-up from 0 to LR
	WeightDecay float64 `json:"weight_decay"` // decoupled, on the decayed parameters only
	Beta1       float64 `json:"beta1"`
	Beta2       float64 `json:"beta2"`
	Eps         float64 `json:"eps"`
	GradClip    float64 `json:"grad_clip"` // global-norm clipping threshold; 0 turns it off

	Seed uint64 `json:"seed"` // seeds the data order (the model has its own seed)

	// Evaluation on a held-out split (cmd/train cuts it off the data, the
	// last ValFraction of the tokens): the mean loss of the first
	// EvalBatches batches of it every EvalEvery steps and at the last step.
	// ValFraction 0 turns it off.
	ValFraction float64 `json:"val_fraction"`
	EvalEvery   int     `json:"eval_every"`
	EvalBatches int     `json:"eval_batches"`

	LogEvery        int    `json:"log_every"`        // plain log line every this many steps
	CheckpointEvery int    `json:"checkpoint_every"` // 0: only the final checkpoint
	KeepCheckpoints int    `json:"keep_checkpoints"` // keep the newest K checkpoints; 0 keeps all
	OutDir          string `json:"out_dir"`          // checkpoints, metrics.jsonl, loss.png
	Resume          string `json:"resume"`           // a checkpoint dir, or an out dir (then its latest)
}

// AdamW is the optimizer's part of the config.
func (c Config) AdamW() optim.AdamWConfig {
	return optim.AdamWConfig{Beta1: c.Beta1, Beta2: c.Beta2, Eps: c.Eps, WeightDecay: c.WeightDecay}
}

// Schedule is the learning-rate schedule of the run: a linear warm-up to LR
// over Warmup steps, then a half cosine down to MinLR at step Steps.
func (c Config) Schedule() optim.WarmupCosine {
	return optim.WarmupCosine{Peak: c.LR, Min: c.MinLR, Warmup: c.Warmup, Steps: c.Steps}
}

// DefaultConfig is a full set of sensible defaults (GPT-2-like AdamW).
func DefaultConfig() Config {
	return Config{
		Steps:       1000,
		Batch:       8,
		Seq:         128,
		LR:          3e-4,
		MinLR:       3e-5,
		Warmup:      100,
		WeightDecay: 0.1,
		Beta1:       0.9,
		Beta2:       0.95,
		Eps:         1e-8,
		GradClip:    1.0,
		Seed:        1337,
		LogEvery:    10,
		OutDir:      "train-out",
	}
}

// WithDefaults returns c with the fields whose zero value makes no sense
// (Steps, Batch, Seq, LR, LogEvery, OutDir; Beta1, Beta2 and Eps when all
// three are zero) set from DefaultConfig. Fields where zero is meaningful
// are left as they are. cmd/train does not call it: a value given there is
// used as given or refused.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.Steps == 0 {
		c.Steps = d.Steps
	}
	if c.Batch == 0 {
		c.Batch = d.Batch
	}
	if c.Seq == 0 {
		c.Seq = d.Seq
	}
	if c.LR == 0 {
		c.LR = d.LR
	}
	if c.Beta1 == 0 && c.Beta2 == 0 && c.Eps == 0 {
		c.Beta1, c.Beta2, c.Eps = d.Beta1, d.Beta2, d.Eps
	}
	if c.LogEvery == 0 {
		c.LogEvery = d.LogEvery
	}
	if c.OutDir == "" {
		c.OutDir = d.OutDir
	}
	return c
}

// Validate reports the first setting that cannot work, saying what was found
// and what is allowed.
func (c Config) Validate() error {
	bad := func(name string, v any, want string) error {
		return fmt.Errorf("train: config %s = %v, want %s", name, v, want)
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case c.Steps <= 0:
		return bad("steps", c.Steps, "> 0")
	case c.Batch <= 0:
		return bad("batch", c.Batch, "> 0")
	case c.Seq <= 0:
		return bad("seq", c.Seq, "> 0")
	case c.Recompute != "" && !validRecompute(c.Recompute):
		return bad("recompute", fmt.Sprintf("%q", c.Recompute), "none, attention or block")
	case c.MicroBatch < 0 || c.MicroBatch > c.Batch:
		return bad("micro_batch", c.MicroBatch, fmt.Sprintf("in [1, batch = %d] (0: one forward per step)", c.Batch))
	case !(c.LR > 0) || !finite(c.LR):
		return bad("lr", c.LR, "a finite value > 0")
	case !(c.MinLR >= 0) || c.MinLR > c.LR:
		return bad("min_lr", c.MinLR, fmt.Sprintf("in [0, lr = %g]", c.LR))
	case c.Warmup < 0 || c.Warmup > c.Steps:
		return bad("warmup", c.Warmup, fmt.Sprintf("in [0, steps = %d]", c.Steps))
	case !(c.WeightDecay >= 0) || !finite(c.WeightDecay):
		return bad("weight_decay", c.WeightDecay, "a finite value >= 0")
	case !(c.Beta1 >= 0 && c.Beta1 < 1):
		return bad("beta1", c.Beta1, "in [0, 1)")
	case !(c.Beta2 >= 0 && c.Beta2 < 1):
		return bad("beta2", c.Beta2, "in [0, 1)")
	case !(c.Eps > 0) || !finite(c.Eps):
		return bad("eps", c.Eps, "a finite value > 0")
	case !(c.GradClip >= 0) || !finite(c.GradClip):
		return bad("grad_clip", c.GradClip, "a finite value >= 0 (0 turns clipping off)")
	case c.LogEvery <= 0:
		return bad("log_every", c.LogEvery, "> 0")
	case c.CheckpointEvery < 0:
		return bad("checkpoint_every", c.CheckpointEvery, ">= 0 (0: only the final checkpoint)")
	case c.KeepCheckpoints < 0:
		return bad("keep_checkpoints", c.KeepCheckpoints, ">= 0 (0 keeps all)")
	case !(c.ValFraction >= 0 && c.ValFraction < 1):
		return bad("val_fraction", c.ValFraction, "in [0, 1) (0: no held-out split)")
	case c.EvalEvery < 0:
		return bad("eval_every", c.EvalEvery, ">= 0")
	case c.EvalBatches < 0:
		return bad("eval_batches", c.EvalBatches, ">= 0")
	case c.ValFraction > 0 && (c.EvalEvery == 0 || c.EvalBatches == 0):
		return bad("eval_every, eval_batches", fmt.Sprintf("%d, %d", c.EvalEvery, c.EvalBatches), "both > 0 with a held-out split (val_fraction > 0); set val_fraction 0 to train without one")
	case c.OutDir == "":
		return bad("out_dir", `""`, "a directory")
	}
	return nil
}

// MicroBatches is the number of micro-batches of a step over dp
// data-parallel replicas: Batch / (MicroBatch × dp), 1 when MicroBatch is
// 0. A batch that is not MicroBatch × accumulation steps × dp is refused,
// naming the three.
func (c Config) MicroBatches(dp int) (int, error) {
	if dp < 1 {
		return 0, fmt.Errorf("train: %d data-parallel replicas, expected at least 1", dp)
	}
	if c.MicroBatch == 0 {
		return 1, nil
	}
	if c.MicroBatch < 0 || c.Batch%(c.MicroBatch*dp) != 0 {
		return 0, fmt.Errorf("train: batch %d is not micro_batch %d × accumulation steps × dp %d: expected a batch divisible by micro_batch × dp = %d",
			c.Batch, c.MicroBatch, dp, c.MicroBatch*dp)
	}
	return c.Batch / (c.MicroBatch * dp), nil
}

func validRecompute(s string) bool {
	_, err := layers.ParseRecompute(s)
	return err == nil
}
