package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/tokens"
)

// A flagDef is one flag of a training run, declared once: its name, the
// config fields it sets (JSON paths "section.json_name", for the rules
// about values given explicitly; none for a flag that steers the run
// without a config field), its section of -help, its help text, and how it
// binds to a flag set. Only a flag given on the command line is applied
// (flag.Visit), so a flag's default never overrides the preset or the file.
type flagDef struct {
	name    string
	paths   []string
	section string
	help    string
	// keep marks a setting of the run's training that a resume takes from
	// the checkpoint unless it is given (resume.go); the training
	// section's flags all are.
	keep bool
	// bind defines the flag on fs and returns what applies its parsed
	// value to a Config.
	bind func(fs *flag.FlagSet, name, help string) func(*Config)
}

// flagOf declares a flag of type T (string, int, bool, float64, uint64 or
// time.Duration) with the default -help shows, whose value set stores
// into a Config.
func flagOf[T string | int | bool | float64 | uint64 | time.Duration](name string, paths []string, def T, help string, set func(c *Config, v T)) flagDef {
	return flagDef{name: name, paths: paths, help: help, bind: func(fs *flag.FlagSet, name, help string) func(*Config) {
		v := new(T)
		switch p := any(v).(type) {
		case *string:
			fs.StringVar(p, name, any(def).(string), help)
		case *int:
			fs.IntVar(p, name, any(def).(int), help)
		case *bool:
			fs.BoolVar(p, name, any(def).(bool), help)
		case *float64:
			fs.Float64Var(p, name, any(def).(float64), help)
		case *uint64:
			fs.Uint64Var(p, name, any(def).(uint64), help)
		case *time.Duration:
			fs.DurationVar(p, name, any(def).(time.Duration), help)
		}
		return func(c *Config) { set(c, *v) }
	}}
}

// kept marks d as a setting a resume keeps (flagDef.keep).
func kept(d flagDef) flagDef {
	d.keep = true
	return d
}

// at is the JSON paths of a flag's config fields.
func at(paths ...string) []string { return paths }

// The sections of -help, in the order it lists them.
const (
	secRun      = "run, data and output"
	secModel    = "model"
	secTrain    = "training"
	secParallel = "parallel layout, transports and overlap"
)

var flagSections = []string{secRun, secModel, secTrain, secParallel}

// trainFlags is every flag of a training run. --config and --model are
// read first (they choose the preset and the file the other flags
// override); loadConfigIn applies the rest in one pass (applyFlags).
var trainFlags = sections(
	secRun,
	flagOf("config", nil, "", "JSON config `file` (flags override it)", func(*Config, string) {}),
	flagOf("device", at("device"), "auto", "where to train: auto (GPU 0 if there is one and the kernels are built, else the CPU), cpu, cuda", func(c *Config, v string) { c.Device = v }),
	kept(flagOf("data", at("data"), "", "training data: token files (text, one token per byte; raw uint16 .bin; raw uint32 .u32; llm.c shards; Megatron .bin+.idx), a comma-separated list, a directory or a glob, read as one stream in that order (a directory's and a glob's files by name); default: the built-in corpus", func(c *Config, v string) { c.Data = v })),
	kept(flagOf("data-format", at("data_format"), string(tokens.Auto), "format of every --data and --val-data file: "+formatNames()+" (auto: detected from each file's content and name)", func(c *Config, v string) { c.DataFormat = v })),
	kept(flagOf("val-data", at("val_data"), "", "validation data, in --data's forms, in place of the held-out tail of --data (--val-fraction)", func(c *Config, v string) { c.ValData = v })),
	flagOf("out", at("train.out_dir"), "", "output `dir`: metrics.jsonl, loss.png, config.json, checkpoints (default train-out)", func(c *Config, v string) { c.Train.OutDir = v }),
	flagOf("resume", at("train.resume"), "", "resume from a checkpoint `dir` (or an out dir: its latest checkpoint)", func(c *Config, v string) { c.Train.Resume = v }),
	flagOf("overwrite", nil, false, "start a new run in an out dir that holds a run, deleting that run's metrics, plot, config and checkpoints", func(c *Config, v bool) { c.overwrite = v }),
	flagOf("init-from", at("init_from"), "", "start from the weights of a Hugging Face Llama or Mixtral `dir` (config.json, model.safetensors), ours (train export) or transformers' save_pretrained", func(c *Config, v string) { c.InitFrom = v }),
	flagOf("dump-routing", at("dump_routing"), "", "write every step's routing (each token's top-k experts per MoE layer, in the global token order) into `dir`, one file per rank; compare two runs with: train routing-diff DIR1 DIR2", func(c *Config, v string) { c.DumpRouting = v }),
	flagOf("cpu-profile", nil, "", "write a Go CPU profile of the run (go tool pprof) to `file`, which must not exist; with several processes each rank writes file.rankN", func(c *Config, v string) { c.cpuProfile = v }),
	flagOf("memory-report", nil, false, "on the CUDA backend (one process, or rank 0 of GPU processes): attribute the allocator's blocks to their call sites and print at the end what held memory at the peak (by category and by site)", func(c *Config, v bool) { c.memReport = v }),
	flagOf("verbose", nil, false, "print the detail behind the device line (why no GPU was found)", func(c *Config, v bool) { c.verbose = v }),

	secModel,
	flagOf("model", at("preset"), "tiny", "named preset: "+strings.Join(presetNames(), ", "), func(c *Config, v string) { c.Preset = v }),
	flagOf("layers", at("model.layers"), 0, "transformer blocks", func(c *Config, v int) { c.Model.Layers = v }),
	flagOf("dim", at("model.dim"), 0, "model width", func(c *Config, v int) { c.Model.Dim = v }),
	flagOf("heads", at("model.heads"), 0, "attention heads", func(c *Config, v int) { c.Model.Heads = v }),
	flagOf("kv-heads", at("model.kv_heads"), 0, "key/value heads of grouped-query attention, dividing --heads (0: as many as --heads, multi-head attention)", func(c *Config, v int) { c.Model.KVHeads = v }),
	flagOf("vocab", at("model.vocab"), 0, "vocabulary size", func(c *Config, v int) { c.Model.Vocab = v }),
	flagOf("seq", at("model.seq"), 0, "sequence length (tokens per sample; also the model's maximum)", func(c *Config, v int) { c.Model.Seq = v }),
	flagOf("ffn", at("model.ffn"), 0, "hidden width of the SwiGLU MLP (0: 8/3 of the width, rounded up to 64)", func(c *Config, v int) { c.Model.FFN = v }),
	flagOf("tied", at("model.tied_embeddings"), true, "tie the LM head to the token embedding", func(c *Config, v bool) { c.Model.TiedEmbeddings = v }),
	flagOf("rope-theta", at("model.rope_theta"), 0.0, "RoPE base", func(c *Config, v float64) { c.Model.RopeTheta = v }),
	flagOf("norm-eps", at("model.norm_eps"), 0.0, "RMSNorm ε", func(c *Config, v float64) { c.Model.NormEps = float32(v) }),
	flagOf("init-std", at("model.init_std"), 0.0, "initialisation std of the weights", func(c *Config, v float64) { c.Model.InitStd = v }),
	flagOf("seed", at("model.seed", "train.seed"), uint64(0), "seed of the initialisation and the data order", func(c *Config, v uint64) { c.Model.Seed, c.Train.Seed = v, v }),
	flagOf("experts", at("model.experts"), 0, "experts per MoE block (0: a dense model)", func(c *Config, v int) { c.Model.Experts = v }),
	flagOf("topk", at("model.top_k"), 0, "experts per token (default 2)", func(c *Config, v int) { c.Model.TopK = v }),
	flagOf("moe-every", at("model.moe_every"), 0, "put MoE in every k-th block (default 1: all)", func(c *Config, v int) { c.Model.MoEEvery = v }),
	flagOf("capacity-factor", at("model.capacity_factor"), 0.0, "expert capacity as a multiple of the even share (0: dropless)", func(c *Config, v float64) { c.Model.CapacityFactor = v }),
	flagOf("aux-loss-coef", at("model.aux_loss_coef"), 0.0, "MoE load-balancing loss weight (0: off)", func(c *Config, v float64) { c.Model.AuxLossCoef = v }),
	flagOf("z-loss-coef", at("model.z_loss_coef"), 0.0, "MoE router z-loss weight (0: off)", func(c *Config, v float64) { c.Model.ZLossCoef = v }),

	secTrain,
	flagOf("batch", at("train.batch"), 0, "sequences per step (the global batch, over every data-parallel replica)", func(c *Config, v int) { c.Train.Batch = v }),
	flagOf("recompute", at("train.recompute"), "none", "activation recompute: none, attention (the backward recomputes the attention core's output) or block (the forward keeps only each block's input; the backward recomputes the block); the same numbers, less memory, more compute", func(c *Config, v string) { c.Train.Recompute = v }),
	flagOf("micro-batch", at("train.micro_batch"), 0, "sequences per forward per data-parallel replica: each step runs batch / (micro-batch × dp) micro-batches whose gradients add up (batch = micro-batch × accumulation steps × dp); 0: one forward per step", func(c *Config, v int) { c.Train.MicroBatch = v }),
	flagOf("steps", at("train.steps"), 0, "optimizer steps", func(c *Config, v int) { c.Train.Steps = v }),
	flagOf("warmup", at("train.warmup"), 0, "linear warm-up steps", func(c *Config, v int) { c.Train.Warmup = v }),
	flagOf("lr", at("train.lr"), 0.0, "peak learning rate", func(c *Config, v float64) { c.Train.LR = v }),
	flagOf("min-lr", at("train.min_lr"), 0.0, "learning rate at the last step (cosine decay)", func(c *Config, v float64) { c.Train.MinLR = v }),
	flagOf("weight-decay", at("train.weight_decay"), 0.0, "AdamW decoupled weight decay", func(c *Config, v float64) { c.Train.WeightDecay = v }),
	flagOf("beta1", at("train.beta1"), 0.0, "AdamW β1 (0 is allowed: no momentum)", func(c *Config, v float64) { c.Train.Beta1 = v }),
	flagOf("beta2", at("train.beta2"), 0.0, "AdamW β2", func(c *Config, v float64) { c.Train.Beta2 = v }),
	flagOf("eps", at("train.eps"), 0.0, "AdamW ε", func(c *Config, v float64) { c.Train.Eps = v }),
	flagOf("grad-clip", at("train.grad_clip"), 0.0, "global gradient-norm clip (0: off)", func(c *Config, v float64) { c.Train.GradClip = v }),
	flagOf("log-every", at("train.log_every"), 0, "print a log line every N steps", func(c *Config, v int) { c.Train.LogEvery = v }),
	flagOf("checkpoint-every", at("train.checkpoint_every"), 0, "write a checkpoint every N steps (the last step always gets one)", func(c *Config, v int) { c.Train.CheckpointEvery = v }),
	flagOf("keep-checkpoints", at("train.keep_checkpoints"), 0, "keep only the newest N checkpoints (0: all)", func(c *Config, v int) { c.Train.KeepCheckpoints = v }),
	flagOf("val-fraction", at("train.val_fraction"), 0.0, "the last fraction of the data held out for validation (0: none; preset 0.05)", func(c *Config, v float64) { c.Train.ValFraction = v }),
	flagOf("eval-every", at("train.eval_every"), 0, "evaluate the validation loss every N steps (and at the last)", func(c *Config, v int) { c.Train.EvalEvery = v }),
	flagOf("eval-batches", at("train.eval_batches"), 0, "batches of the validation split per evaluation", func(c *Config, v int) { c.Train.EvalBatches = v }),

	secParallel,
	kept(flagOf("tp", at("parallel.tp"), 1, "tensor-parallel ranks: TP must divide heads, kv-heads, dim, ffn and vocab", func(c *Config, v int) { c.Parallel.TP = v })),
	kept(flagOf("dp", at("parallel.dp"), 1, "data-parallel replicas, each taking batch/dp sequences (with --world and no --dp: world/tp)", func(c *Config, v int) { c.Parallel.DP = v })),
	kept(flagOf("ep", at("parallel.ep"), 1, "expert-parallel ranks of an MoE model: EP must divide the world (dp × tp) and the experts", func(c *Config, v int) { c.Parallel.EP = v })),
	flagOf("world", at("parallel.world"), 0, "ranks, run as goroutines on the CPU (default dp × tp, which it must equal)", func(c *Config, v int) { c.Parallel.World = v }),
	kept(flagOf("sequence-parallel", at("parallel.sequence_parallel"), false, "split the residual stream and the norms along the tokens over the TP group (needs --tp > 1)", func(c *Config, v bool) { c.Parallel.SequenceParallel = v })),
	flagOf("comm-timeout", at("parallel.comm_timeout"), defaultCommTimeout, "how long a rank waits for the others in a collective before the run fails naming the missing ranks", func(c *Config, v time.Duration) { c.Parallel.CommTimeout = Duration(v) }),
	flagOf("nproc", at("parallel.nproc"), 0, "start `N` local processes of this command, one rank each (the world defaults to N); see --comm", func(c *Config, v int) { c.Parallel.NProc = v }),
	flagOf("comm", at("parallel.comm"), "", "transport between the ranks: local (goroutines of one process, CPU), tcp (processes, CPU), nccl or nvshmem (processes, GPUs), nccl+nvshmem (processes, one GPU each: NCCL for the collectives, NVSHMEM symmetric memory for the pipelined and fused sites); default local, or with --nproc or a launcher (torchrun, srun, mpirun) tcp on the CPU and nccl with --device cuda", func(c *Config, v string) { c.Parallel.Comm = v }),
	flagOf("overlap", at("overlap.default"), "", "strategy of the communication sites: "+strings.Join(overlap.Names, ", ")+
		" (default collective; per-site choices in the config's \"overlap\" section)", func(c *Config, v string) { c.Overlap.Default = v }),
	flagOf("shadow-every", at("shadow.every"), 0, "shadow mode: every `N`-th step each communication site whose strategy is not collective also runs collective from the same inputs, and the differences are recorded (metrics.jsonl's \"shadow\", a table at the end); the config's \"shadow\" section also picks sites and fail_above, and samples every "+fmt.Sprint(overlap.DefaultShadowEvery)+" steps without every",
		func(c *Config, v int) {
			if c.Shadow == nil {
				c.Shadow = &overlap.ShadowConfig{}
			}
			c.Shadow.Every = v
		}),
	flagOf("autotune", at("autotune"), false, "with --overlap auto: time collective against pipelined at start for each site the autotune cache has no entry for (a verified micro-run on this run's ranks) and write the choices into the cache", func(c *Config, v bool) { c.Autotune = v }),
	flagOf("autotune-cache", at("autotune_cache"), "", "autotune cache `file` that --overlap auto picks from (cmd/ablate's autotune.json; default OUT/autotune.json when it exists)", func(c *Config, v string) { c.AutotuneCache = v }),
	flagOf("grouped-gemm", at("grouped_gemm"), GroupedAuto, "the MoE layers' expert GEMMs: auto (the backend's preference), on (the backend's grouped GEMM: with --overlap pipelined on --comm nvshmem GPUs the step reads no counts on the host), off (one GEMM per expert)", func(c *Config, v string) { c.GroupedGEMM = v }),
	kept(flagOf("grad-reduce-dtype", at("parallel.grad_reduce_dtype"), ReduceFP32, "the dtype the gradients are summed in over the replicas: fp32 (a bf16 model's fp32 main gradients) or bf16 (rounded to bf16 for the sum; a bf16 model only)", func(c *Config, v string) { c.Parallel.GradReduceDType = v })),
	kept(flagOf("distributed-optimizer", at("parallel.distributed_optimizer"), false, "shard the optimizer's fp32 master weights and AdamW moments over the data-parallel replicas (the experts' over the ranks holding the same experts): ZeRO stage 1, as Megatron-LM's distributed optimizer; the gradients are reduce-scattered and the updated parameters all-gathered", func(c *Config, v bool) { c.Parallel.DistributedOptimizer = v })),
	flagOf("grad-bucket-mb", at("parallel.grad_bucket_mb"), 0.0, "size in MiB of the buckets the gradients are summed in over the replicas (0: 25, PyTorch DDP's)", func(c *Config, v float64) { c.Parallel.GradBucketMB = v }),
	flagOf("overlap-grad-reduce", at("parallel.overlap_grad_reduce"), true, "start each bucket's sum over the replicas as soon as the backward has completed it, beside the rest of the backward (false: after the whole backward)", func(c *Config, v bool) { c.Parallel.OverlapGradReduce = &v }),
	flagOf("fused-transfer", at("fused_transfer"), "", "how the fused strategy's all-gathers land the peers' shards: pull (copy-engine pulls from the peers' symmetric memory, the default) or put (a few CTAs of each peer store its shard into this rank's symmetric buffer); default $"+peercopy.TransferEnv+", else pull; needs --overlap fused or auto on --comm nvshmem GPUs", func(c *Config, v string) { c.FusedTransfer = v }),
)

// sections builds the table from a list of section names, each followed
// by its flags.
func sections(items ...any) []flagDef {
	var defs []flagDef
	section := ""
	for _, it := range items {
		switch it := it.(type) {
		case string:
			section = it
		case flagDef:
			it.section = section
			it.keep = it.keep || section == secTrain
			defs = append(defs, it)
		}
	}
	return defs
}

// flagSet is a parsed command line: the flag set and, for each flag of
// trainFlags, what applies it.
type flagSet struct {
	*flag.FlagSet
	apply map[string]func(*Config)
}

// newFlagSet defines every flag of trainFlags, with -help listing them by
// section.
func newFlagSet() *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet("train", flag.ContinueOnError), apply: map[string]func(*Config){}}
	for _, d := range trainFlags {
		fs.apply[d.name] = d.bind(fs.FlagSet, d.name, d.help)
	}
	fs.Usage = func() { printFlags(fs.Output(), fs.FlagSet) }
	return fs
}

// given is the set of flags given on the command line.
func (fs *flagSet) given() map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// applyFlags sets the config fields of the flags given on the command line
// (set), then the rules between flags: --lr without --min-lr lowers a
// minimum above it to a tenth of it; --world without --dp derives dp.
func (fs *flagSet) applyFlags(cfg *Config, set map[string]bool) {
	for _, d := range trainFlags {
		if set[d.name] {
			fs.apply[d.name](cfg)
		}
	}
	if t := &cfg.Train; set["lr"] && !set["min-lr"] && t.MinLR > t.LR {
		t.MinLR = t.LR / 10
	}
	if set["world"] && !set["dp"] {
		cfg.Parallel.DP = 0 // derived: world / tp
	}
}

// flagPaths maps each flag to the config fields it sets.
var flagPaths = func() map[string][]string {
	m := map[string][]string{}
	for _, d := range trainFlags {
		m[d.name] = d.paths
	}
	return m
}()

// printFlags is -help: the flags by section, each as flag.PrintDefaults
// writes it.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage of train: train [flags] (a training run), or train export|logits|routing-diff -help\n")
	for _, sec := range flagSections {
		fmt.Fprintf(w, "\n%s:\n", sec)
		for _, d := range trainFlags {
			if d.section != sec {
				continue
			}
			f := fs.Lookup(d.name)
			kind, usage := flag.UnquoteUsage(f)
			line := "  -" + f.Name
			if kind != "" {
				line += " " + kind
			}
			fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
			if !isZeroDefault(f.DefValue) {
				if _, str := f.Value.(flag.Getter).Get().(string); str {
					fmt.Fprintf(w, " (default %q)", f.DefValue)
				} else {
					fmt.Fprintf(w, " (default %v)", f.DefValue)
				}
			}
			fmt.Fprintln(w)
		}
	}
	var kept []string
	for _, d := range trainFlags {
		if d.keep && d.section != secTrain {
			kept = append(kept, "-"+d.name)
		}
	}
	fmt.Fprintf(w, "\nOn -resume the training settings (the training section's, %s) are the checkpoint's unless given.\n", strings.Join(kept, ", "))
}

// isZeroDefault reports whether a flag's default is its type's zero value,
// which -help leaves unsaid (as flag.PrintDefaults does).
func isZeroDefault(v string) bool {
	switch v {
	case "", "0", "false", "0s":
		return true
	}
	return false
}
