package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strings"
)

// runFlags are the flags of the rules about out dirs, evaluation, the
// optimizer's betas, the MoE loss coefficients and --init-from (kept apart
// from flagValues so that the two grow without touching each other).
type runFlags struct {
	overwrite                  bool
	initFrom                   string
	valFraction                float64
	evalEvery, evalBatches     int
	beta1, beta2, eps          float64
	auxLossCoef, zLossCoef     float64
	ropeTheta, normEps, initSD float64
}

func addRunFlags(fs *flag.FlagSet, r *runFlags) {
	fs.BoolVar(&r.overwrite, "overwrite", false, "start a new run in an out dir that holds a run, deleting that run's metrics, plot, config and checkpoints")
	fs.StringVar(&r.initFrom, "init-from", "", "start from the weights of a Hugging Face Llama or Mixtral `dir` (config.json, model.safetensors), ours (train export) or transformers' save_pretrained")
	fs.Float64Var(&r.valFraction, "val-fraction", 0, "the last fraction of the data held out for validation (0: none; preset 0.05)")
	fs.IntVar(&r.evalEvery, "eval-every", 0, "evaluate the validation loss every N steps (and at the last)")
	fs.IntVar(&r.evalBatches, "eval-batches", 0, "batches of the validation split per evaluation")
	fs.Float64Var(&r.beta1, "beta1", 0, "AdamW β1 (0 is allowed: no momentum)")
	fs.Float64Var(&r.beta2, "beta2", 0, "AdamW β2")
	fs.Float64Var(&r.eps, "eps", 0, "AdamW ε")
	fs.Float64Var(&r.auxLossCoef, "aux-loss-coef", 0, "MoE load-balancing loss weight (0: off)")
	fs.Float64Var(&r.zLossCoef, "z-loss-coef", 0, "MoE router z-loss weight (0: off)")
	fs.Float64Var(&r.ropeTheta, "rope-theta", 0, "RoPE base")
	fs.Float64Var(&r.normEps, "norm-eps", 0, "RMSNorm ε")
	fs.Float64Var(&r.initSD, "init-std", 0, "initialisation std of the weights")
}

// applyRunFlags sets the fields of the flags addRunFlags defines that were
// given on the command line.
func applyRunFlags(cfg *Config, r *runFlags, set map[string]bool) {
	m, t := &cfg.Model, &cfg.Train
	for name, p := range map[string]struct {
		dst *float64
		v   float64
	}{
		"val-fraction": {&t.ValFraction, r.valFraction}, "beta1": {&t.Beta1, r.beta1}, "beta2": {&t.Beta2, r.beta2},
		"eps": {&t.Eps, r.eps}, "aux-loss-coef": {&m.AuxLossCoef, r.auxLossCoef}, "z-loss-coef": {&m.ZLossCoef, r.zLossCoef},
		"rope-theta": {&m.RopeTheta, r.ropeTheta}, "init-std": {&m.InitStd, r.initSD},
	} {
		if set[name] {
			*p.dst = p.v
		}
	}
	if set["norm-eps"] {
		m.NormEps = float32(r.normEps)
	}
	if set["eval-every"] {
		t.EvalEvery = r.evalEvery
	}
	if set["eval-batches"] {
		t.EvalBatches = r.evalBatches
	}
	if set["init-from"] {
		cfg.InitFrom = r.initFrom
	}
	cfg.overwrite = r.overwrite
}

// flagFields maps each flag to the config fields it sets ("section.json
// name"), for the rules about values given explicitly.
var flagFields = map[string][]string{
	"layers": {"model.layers"}, "dim": {"model.dim"}, "heads": {"model.heads"}, "kv-heads": {"model.kv_heads"}, "vocab": {"model.vocab"},
	"seq": {"model.seq"}, "ffn": {"model.ffn"}, "tied": {"model.tied_embeddings"}, "experts": {"model.experts"},
	"topk": {"model.top_k"}, "moe-every": {"model.moe_every"}, "capacity-factor": {"model.capacity_factor"},
	"aux-loss-coef": {"model.aux_loss_coef"}, "z-loss-coef": {"model.z_loss_coef"}, "rope-theta": {"model.rope_theta"},
	"norm-eps": {"model.norm_eps"}, "init-std": {"model.init_std"}, "seed": {"model.seed", "train.seed"},
	"batch": {"train.batch"}, "steps": {"train.steps"}, "warmup": {"train.warmup"}, "lr": {"train.lr"},
	"min-lr": {"train.min_lr"}, "weight-decay": {"train.weight_decay"}, "grad-clip": {"train.grad_clip"},
	"log-every": {"train.log_every"}, "checkpoint-every": {"train.checkpoint_every"}, "keep-checkpoints": {"train.keep_checkpoints"},
	"out": {"train.out_dir"}, "resume": {"train.resume"}, "val-fraction": {"train.val_fraction"},
	"eval-every": {"train.eval_every"}, "eval-batches": {"train.eval_batches"}, "beta1": {"train.beta1"},
	"beta2": {"train.beta2"}, "eps": {"train.eps"},
}

// explicitFields is the set of config fields the file (its JSON) and the
// flags given (set) name. A preset named by --model or the file's
// "preset" makes every model field explicit: the preset says what the
// model is.
func explicitFields(file []byte, set map[string]bool) (map[string]bool, error) {
	ex := map[string]bool{}
	for f := range set {
		for _, k := range flagFields[f] {
			ex[k] = true
		}
	}
	if set["model"] {
		ex["preset"] = true
	}
	if file != nil {
		var top map[string]json.RawMessage
		if err := json.Unmarshal(file, &top); err != nil {
			return nil, err
		}
		for k, raw := range top {
			ex[k] = true
			var sec map[string]json.RawMessage
			if json.Unmarshal(raw, &sec) == nil {
				for f := range sec {
					ex[k+"."+f] = true
				}
			}
		}
	}
	return ex, nil
}

// modelFields lists the model fields given explicitly (all of them after
// an explicit preset), sorted.
func (c *Config) explicitModel() map[string]bool {
	out := map[string]bool{}
	for k := range c.explicit {
		if f, ok := strings.CutPrefix(k, "model."); ok {
			out[f] = true
		}
	}
	if c.explicit["preset"] {
		out["*"] = true
	}
	return out
}

// Explicit reports whether the config field key ("train.warmup") was given
// by the file or a flag.
func (c *Config) Explicit(key string) bool { return c.explicit[key] }

// fieldDiffs compares two JSON objects field by field and returns
// "name: a vs b" for each field that differs, sorted.
func fieldDiffs(a, b any, nameA, nameB string, only func(field string) bool) ([]string, error) {
	ma, err := toMap(a)
	if err != nil {
		return nil, err
	}
	mb, err := toMap(b)
	if err != nil {
		return nil, err
	}
	var diffs []string
	for k, va := range ma {
		if only != nil && !only(k) {
			continue
		}
		if vb := mb[k]; string(va) != string(vb) {
			diffs = append(diffs, fmt.Sprintf("%s: %s %s, %s %s", k, nameA, orAbsent(va), nameB, orAbsent(vb)))
		}
	}
	sort.Strings(diffs)
	return diffs, nil
}

func orAbsent(r json.RawMessage) string {
	if r == nil {
		return "(absent)"
	}
	return string(r)
}

func toMap(v any) (map[string]json.RawMessage, error) {
	js, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if js, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	var m map[string]json.RawMessage
	return m, json.Unmarshal(js, &m)
}
