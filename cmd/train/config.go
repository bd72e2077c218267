package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/peercopy"
	"github.com/asynctp/asynctp/train"
)

// Config is everything one run of cmd/train needs. It is what --config reads
// (JSON) and what the run writes back to OUT/config.json. A preset fills it
// first, then the file's fields override the preset's, then flags override
// both.
type Config struct {
	Preset   string           `json:"preset"`
	Device   string           `json:"device"` // auto, cpu, cuda
	Data     string           `json:"data"`   // text file (bytes as tokens) or .bin of uint16 tokens; empty: the built-in corpus
	Model    layers.GPTConfig `json:"model"`
	Train    train.Config     `json:"train"`
	Parallel ParallelConfig   `json:"parallel"`
	// Overlap chooses the strategy of each communication site (--overlap,
	// overlap.Config: {"default": ..., "sites": {...}}).
	Overlap overlap.Config `json:"overlap"`
	// AutotuneCache is the cache "auto" picks from (--autotune-cache,
	// written by cmd/ablate); empty: OUT/autotune.json when it exists.
	AutotuneCache string `json:"autotune_cache,omitempty"`
	// Autotune (--autotune, with "auto"): a site the cache has no entry
	// for is timed at start (collective against pipelined, verified) and
	// the result written into the cache.
	Autotune bool `json:"autotune,omitempty"`
	// InitFrom is a Hugging Face Llama or Mixtral directory the run's
	// weights start from (hf.go).
	InitFrom string `json:"init_from,omitempty"`
	// GroupedGEMM is the form of the MoE layers' expert GEMMs
	// (--grouped-gemm auto|on|off, grouped.go).
	GroupedGEMM string `json:"grouped_gemm,omitempty"`
	// FusedTransfer is how the fused strategy's gathers move the peers'
	// shards (--fused-transfer pull|put, peercopy.Fused.Transfer; empty:
	// $ASYNCTP_FUSED_TRANSFER, else pull; fusedtransfer.go).
	FusedTransfer string `json:"fused_transfer,omitempty"`
	// DumpRouting is a directory each rank writes every step's routing
	// into (--dump-routing, routing.go); empty: none.
	DumpRouting string `json:"dump_routing,omitempty"`

	explicit   map[string]bool // the fields the file and the flags give (explicitFields)
	overwrite  bool            // --overwrite
	memReport  bool            // --memory-report
	verbose    bool            // --verbose
	cpuProfile string          // --cpu-profile
	adopted    bool            // prepare has taken the model of the resume or --init-from
}

// presets are named starting points. tiny trains on two CPU cores in about a
// minute; gpt2-124m is GPT-2 small's shape (with RMSNorm, SwiGLU and RoPE).
var presets = map[string]func() Config{
	"tiny":      tinyPreset,
	"tiny-moe":  tinyMoEPreset,
	"gpt2-124m": gpt2Preset,
	"llama-1b":  llama1BPreset,
}

func tinyPreset() Config {
	tc := train.DefaultConfig()
	tc.Steps, tc.Batch, tc.Seq = 200, 8, 64
	tc.LR, tc.MinLR, tc.Warmup = 3e-3, 3e-4, 20
	tc.WeightDecay, tc.LogEvery, tc.CheckpointEvery = 0.0, 20, 100
	tc.ValFraction, tc.EvalEvery, tc.EvalBatches = 0.05, 20, 4
	return Config{Preset: "tiny", Device: "auto",
		Model: layers.GPTConfig{Layers: 2, Dim: 64, Heads: 4, Vocab: 256, Seq: 64, TiedEmbeddings: true, Seed: 1337,
			AuxLossCoef: 0.01, ZLossCoef: 1e-3}, // the MoE coefficients, used once --experts makes it an MoE model
		Train:    tc,
		Parallel: defaultParallel()}
}

// tinyMoEPreset is tiny with a mixture of 8 experts (top-2) in every block.
func tinyMoEPreset() Config {
	c := tinyPreset()
	c.Preset = "tiny-moe"
	c.Model.Experts, c.Model.TopK, c.Model.MoEEvery = 8, 2, 1
	return c
}

func gpt2Preset() Config {
	tc := train.DefaultConfig()
	tc.Steps, tc.Batch, tc.Seq = 1000, 8, 1024
	tc.LR, tc.MinLR, tc.Warmup = 6e-4, 6e-5, 100
	tc.LogEvery, tc.CheckpointEvery = 10, 500
	tc.ValFraction, tc.EvalEvery, tc.EvalBatches = 0.05, 100, 8
	return Config{Preset: "gpt2-124m", Device: "auto",
		Model: layers.GPTConfig{Layers: 12, Dim: 768, Heads: 12, Vocab: 50304, Seq: 1024, FFN: 2048, TiedEmbeddings: true, Seed: 1337,
			AuxLossCoef: 0.01, ZLossCoef: 1e-3},
		Train:    tc,
		Parallel: defaultParallel()}
}

// llama1BPreset is a 1.1B-parameter Llama-shaped model (width 2048, 16 heads
// of 128, 20 layers, SwiGLU 5632, vocab 32000, sequence 2048, tied head):
// the 1B-class model of the one-GPU comparison with PyTorch (BENCHMARKS.md);
// batch 8 × 2048 = 16384 tokens per step.
func llama1BPreset() Config {
	c := gpt2Preset()
	c.Preset = "llama-1b"
	c.Train.Batch, c.Train.Seq = 8, 2048
	c.Train.LR, c.Train.MinLR = 3e-4, 3e-5
	c.Model.Layers, c.Model.Dim, c.Model.Heads, c.Model.FFN = 20, 2048, 16, 5632
	c.Model.Vocab, c.Model.Seq = 32000, 2048
	return c
}

func presetNames() []string {
	var names []string
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// flagValues are the command-line settings; only those given on the command
// line are applied (flag.Visit), so a flag's default never overrides the file.
type flagValues struct {
	config, preset, device, data, out, resume            string
	layers, dim, heads, kvHeads, vocab, seq, ffn         int
	batch, steps, warmup, logEvery, ckptEvery, keepCkpts int
	lr, minLR, weightDecay, gradClip                     float64
	seed                                                 uint64
	experts, topK, moeEvery                              int
	capacityFactor                                       float64
	tied                                                 bool
	tp, dp, ep, world                                    int
	sequenceParallel                                     bool
	commTimeout                                          time.Duration
	nproc                                                int
	comm                                                 string
	overlap                                              string
	autotuneCache                                        string
	autotune                                             bool
	groupedGEMM, dumpRouting, fusedTransfer              string
	memoryReport, verbose                                bool
	cpuProfile                                           string
	run                                                  runFlags
}

func newFlagSet(fv *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.StringVar(&fv.config, "config", "", "JSON config `file` (flags override it)")
	fs.StringVar(&fv.preset, "model", "tiny", "named preset: "+strings.Join(presetNames(), ", "))
	fs.StringVar(&fv.device, "device", "auto", "where to train: auto (GPU 0 if there is one and the kernels are built, else the CPU), cpu, cuda")
	fs.StringVar(&fv.data, "data", "", "training data: a text file (bytes are tokens) or a .bin file of uint16 tokens; default: the built-in corpus")
	fs.StringVar(&fv.out, "out", "", "output `dir`: metrics.jsonl, loss.png, config.json, checkpoints (default train-out)")
	fs.StringVar(&fv.resume, "resume", "", "resume from a checkpoint `dir` (or an out dir: its latest checkpoint)")
	fs.IntVar(&fv.layers, "layers", 0, "transformer blocks")
	fs.IntVar(&fv.dim, "dim", 0, "model width")
	fs.IntVar(&fv.heads, "heads", 0, "attention heads")
	fs.IntVar(&fv.kvHeads, "kv-heads", 0, "key/value heads of grouped-query attention, dividing --heads (0: as many as --heads, multi-head attention)")
	fs.IntVar(&fv.vocab, "vocab", 0, "vocabulary size")
	fs.IntVar(&fv.seq, "seq", 0, "sequence length (tokens per sample; also the model's maximum)")
	fs.IntVar(&fv.ffn, "ffn", 0, "hidden width of the SwiGLU MLP (0: 8/3 of the width, rounded up to 64)")
	fs.BoolVar(&fv.tied, "tied", true, "tie the LM head to the token embedding")
	fs.IntVar(&fv.experts, "experts", 0, "experts per MoE block (0: a dense model)")
	fs.IntVar(&fv.topK, "topk", 0, "experts per token (default 2)")
	fs.IntVar(&fv.moeEvery, "moe-every", 0, "put MoE in every k-th block (default 1: all)")
	fs.Float64Var(&fv.capacityFactor, "capacity-factor", 0, "expert capacity as a multiple of the even share (0: dropless)")
	fs.IntVar(&fv.batch, "batch", 0, "sequences per step")
	fs.IntVar(&fv.steps, "steps", 0, "optimizer steps")
	fs.IntVar(&fv.warmup, "warmup", 0, "linear warm-up steps")
	fs.Float64Var(&fv.lr, "lr", 0, "peak learning rate")
	fs.Float64Var(&fv.minLR, "min-lr", 0, "learning rate at the last step (cosine decay)")
	fs.Float64Var(&fv.weightDecay, "weight-decay", 0, "AdamW decoupled weight decay")
	fs.Float64Var(&fv.gradClip, "grad-clip", 0, "global gradient-norm clip (0: off)")
	fs.Uint64Var(&fv.seed, "seed", 0, "seed of the initialisation and the data order")
	fs.IntVar(&fv.logEvery, "log-every", 0, "print a log line every N steps")
	fs.IntVar(&fv.ckptEvery, "checkpoint-every", 0, "write a checkpoint every N steps (the last step always gets one)")
	fs.IntVar(&fv.keepCkpts, "keep-checkpoints", 0, "keep only the newest N checkpoints (0: all)")
	fs.IntVar(&fv.tp, "tp", 1, "tensor-parallel ranks: TP must divide heads, kv-heads, dim, ffn and vocab")
	fs.IntVar(&fv.dp, "dp", 1, "data-parallel replicas, each taking batch/dp sequences (with --world and no --dp: world/tp)")
	fs.IntVar(&fv.ep, "ep", 1, "expert-parallel ranks of an MoE model: EP must divide the world (dp × tp) and the experts")
	fs.IntVar(&fv.world, "world", 0, "ranks, run as goroutines on the CPU (default dp × tp, which it must equal)")
	fs.BoolVar(&fv.sequenceParallel, "sequence-parallel", false, "split the residual stream and the norms along the tokens over the TP group (needs --tp > 1)")
	fs.DurationVar(&fv.commTimeout, "comm-timeout", defaultCommTimeout, "how long a rank waits for the others in a collective before the run fails naming the missing ranks")
	fs.IntVar(&fv.nproc, "nproc", 0, "start `N` local processes of this command, one rank each (the world defaults to N); see --comm")
	fs.StringVar(&fv.comm, "comm", "", "transport between the ranks: local (goroutines of one process, CPU), tcp (processes, CPU), nccl or nvshmem (processes, GPUs); default local, or with --nproc or a launcher (torchrun, srun, mpirun) tcp on the CPU and nccl with --device cuda")
	fs.StringVar(&fv.overlap, "overlap", "", "strategy of the communication sites: "+strings.Join(overlap.Names, ", ")+
		" (default collective; per-site choices in the config's \"overlap\" section)")
	fs.BoolVar(&fv.autotune, "autotune", false, "with --overlap auto: time collective against pipelined at start for each site the autotune cache has no entry for (a verified micro-run on this run's ranks) and write the choices into the cache")
	fs.StringVar(&fv.autotuneCache, "autotune-cache", "", "autotune cache `file` that --overlap auto picks from (cmd/ablate's autotune.json; default OUT/autotune.json when it exists)")
	fs.StringVar(&fv.groupedGEMM, "grouped-gemm", GroupedAuto, "the MoE layers' expert GEMMs: auto (the backend's preference), on (the backend's grouped GEMM: with --overlap pipelined on --comm nvshmem GPUs the step reads no counts on the host), off (one GEMM per expert)")
	fs.StringVar(&fv.fusedTransfer, "fused-transfer", "", "how the fused strategy's all-gathers land the peers' shards: pull (copy-engine pulls from the peers' symmetric memory, the default) or put (a few CTAs of each peer store its shard into this rank's symmetric buffer); default $"+peercopy.TransferEnv+", else pull; needs --overlap fused or auto on --comm nvshmem GPUs")
	fs.StringVar(&fv.dumpRouting, "dump-routing", "", "write every step's routing (each token's top-k experts per MoE layer, in the global token order) into `dir`, one file per rank; compare two runs with: train routing-diff DIR1 DIR2")
	fs.StringVar(&fv.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the run (go tool pprof) to `file`, which must not exist; with several processes each rank writes file.rankN")
	fs.BoolVar(&fv.memoryReport, "memory-report", false, "on the CUDA backend (one process): attribute the allocator's blocks to their call sites and print at the end what held memory at the peak (by category and by site)")
	fs.BoolVar(&fv.verbose, "verbose", false, "print the detail behind the device line (why no GPU was found)")
	addRunFlags(fs, &fv.run)
	return fs
}

// loadConfig builds the run's Config from the arguments: preset, then file,
// then flags given on the command line (for a process that no launcher
// started).
func loadConfig(args []string) (Config, error) { return loadConfigIn(args, origin{}) }

// origin is how this process was started: by a launcher (torchrun, srun,
// mpirun, or --nproc's own) as one rank of a world of the given size, or
// not (the zero value).
type origin struct {
	launched bool
	world    int
}

// loadConfigIn is loadConfig for a process started as l: under a launcher
// the world defaults to the launcher's.
func loadConfigIn(args []string, l origin) (Config, error) {
	var fv flagValues
	fs := newFlagSet(&fv)
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (flags start with -; see -help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	// The preset: the flag wins, then the file's "preset", then tiny.
	var file []byte
	name := fv.preset
	if fv.config != "" {
		var err error
		if file, err = os.ReadFile(fv.config); err != nil {
			return Config{}, fmt.Errorf("reading config: %w", err)
		}
		var head struct {
			Preset string `json:"preset"`
		}
		if err := json.Unmarshal(file, &head); err != nil {
			return Config{}, fmt.Errorf("config %s is not valid JSON: %w", fv.config, err)
		}
		if head.Preset != "" && !set["model"] {
			name = head.Preset
		}
	}
	mk, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown model preset %q, expected one of %s", name, strings.Join(presetNames(), ", "))
	}
	cfg := mk()
	if file != nil {
		dec := json.NewDecoder(bytes.NewReader(file))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", fv.config, err)
		}
		cfg.Preset = name
		named, err := explicitFields(file, nil)
		if err != nil {
			return Config{}, fmt.Errorf("config %s: %w", fv.config, err)
		}
		if err := checkSeq(&cfg, named, fv.config); err != nil {
			return Config{}, err
		}
	}
	applyFlags(&cfg, &fv, set)
	var err error
	if cfg.explicit, err = explicitFields(file, set); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", fv.config, err)
	}
	cfg.Train.Seq = cfg.Model.Seq // one sequence length: the model's
	if p := &cfg.Parallel; p.World == 0 && p.DP == 0 {
		// The world defaults to the processes there are (dp = world / tp).
		switch {
		case l.launched:
			p.World = l.world
		case p.NProc > 0:
			p.World = p.NProc
		}
	}
	if err := cfg.validate(l); err != nil {
		return cfg, err
	}
	// What cannot take effect is judged on the resolved configuration
	// (the layout, the transport), after the values themselves passed.
	preset := mk()
	preset.Model = preset.Model.WithDefaults()
	return cfg, cfg.checkTakesEffect(set, &preset, fv.config, l)
}

func applyFlags(cfg *Config, fv *flagValues, set map[string]bool) {
	m, t := &cfg.Model, &cfg.Train
	ints := map[string]struct {
		dst *int
		v   int
	}{
		"layers": {&m.Layers, fv.layers}, "dim": {&m.Dim, fv.dim}, "heads": {&m.Heads, fv.heads}, "kv-heads": {&m.KVHeads, fv.kvHeads},
		"vocab": {&m.Vocab, fv.vocab}, "seq": {&m.Seq, fv.seq}, "ffn": {&m.FFN, fv.ffn},
		"batch": {&t.Batch, fv.batch}, "steps": {&t.Steps, fv.steps}, "warmup": {&t.Warmup, fv.warmup},
		"log-every": {&t.LogEvery, fv.logEvery}, "checkpoint-every": {&t.CheckpointEvery, fv.ckptEvery},
		"keep-checkpoints": {&t.KeepCheckpoints, fv.keepCkpts},
		"experts":          {&m.Experts, fv.experts}, "topk": {&m.TopK, fv.topK}, "moe-every": {&m.MoEEvery, fv.moeEvery},
	}
	for name, p := range ints {
		if set[name] {
			*p.dst = p.v
		}
	}
	floats := map[string]struct {
		dst *float64
		v   float64
	}{
		"lr": {&t.LR, fv.lr}, "min-lr": {&t.MinLR, fv.minLR},
		"weight-decay": {&t.WeightDecay, fv.weightDecay}, "grad-clip": {&t.GradClip, fv.gradClip},
		"capacity-factor": {&m.CapacityFactor, fv.capacityFactor},
	}
	for name, p := range floats {
		if set[name] {
			*p.dst = p.v
		}
	}
	if set["lr"] && !set["min-lr"] && t.MinLR > t.LR {
		t.MinLR = t.LR / 10
	}
	if set["seed"] {
		m.Seed, t.Seed = fv.seed, fv.seed
	}
	if set["tied"] {
		m.TiedEmbeddings = fv.tied
	}
	if set["device"] {
		cfg.Device = fv.device
	}
	if set["data"] {
		cfg.Data = fv.data
	}
	if set["out"] {
		t.OutDir = fv.out
	}
	if set["resume"] {
		t.Resume = fv.resume
	}
	p := &cfg.Parallel
	pints := map[string]struct {
		dst *int
		v   int
	}{"tp": {&p.TP, fv.tp}, "dp": {&p.DP, fv.dp}, "ep": {&p.EP, fv.ep}, "world": {&p.World, fv.world}}
	for name, v := range pints {
		if set[name] {
			*v.dst = v.v
		}
	}
	if set["world"] && !set["dp"] {
		p.DP = 0 // derived: world / tp
	}
	if set["sequence-parallel"] {
		p.SequenceParallel = fv.sequenceParallel
	}
	if set["comm-timeout"] {
		p.CommTimeout = Duration(fv.commTimeout)
	}
	if set["nproc"] {
		p.NProc = fv.nproc
	}
	if set["comm"] {
		p.Comm = fv.comm
	}
	if set["overlap"] {
		cfg.Overlap.Default = fv.overlap
	}
	if set["autotune-cache"] {
		cfg.AutotuneCache = fv.autotuneCache
	}
	if set["autotune"] {
		cfg.Autotune = fv.autotune
	}
	if set["grouped-gemm"] {
		cfg.GroupedGEMM = fv.groupedGEMM
	}
	if set["dump-routing"] {
		cfg.DumpRouting = fv.dumpRouting
	}
	if set["fused-transfer"] {
		cfg.FusedTransfer = fv.fusedTransfer
	}
	cfg.memReport = fv.memoryReport
	cfg.verbose = fv.verbose
	cfg.cpuProfile = fv.cpuProfile
	applyRunFlags(cfg, &fv.run, set)
}

func (c *Config) validate(l origin) error {
	if !slices.Contains(devices, c.Device) {
		return fmt.Errorf("unknown device %q, expected one of %s", c.Device, strings.Join(devices, ", "))
	}
	// Every value is the preset's, the file's or a flag's, used as given
	// (train.Config.WithDefaults would turn an explicit 0 into a default):
	// the model's optional fields resolve to their defaults, written back so
	// that config.json holds what the run uses, and a preset's warm-up
	// longer than the steps given shrinks to them; a warm-up given
	// explicitly is refused instead.
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if err := c.Overlap.Validate(); err != nil {
		return err
	}
	if err := c.checkGrouped(); err != nil {
		return err
	}
	if c.Autotune && !usesAuto(c.Overlap) {
		return fmt.Errorf("--autotune: expected --overlap auto (or a site configured \"auto\"): no site would use the timings")
	}
	c.Model = c.Model.WithDefaults()
	if c.Train.Warmup > c.Train.Steps && c.Train.Steps > 0 && !c.explicit["train.warmup"] {
		c.Train.Warmup = c.Train.Steps
	}
	if err := c.Train.Validate(); err != nil {
		return err
	}
	var err error
	if c.Parallel, err = c.Parallel.resolve(); err != nil {
		return err
	}
	if err := c.checkFusedTransfer(); err != nil {
		return err
	}
	if c.modelKnown() {
		if err := c.Parallel.check(c.Model.WithDefaults(), c.Train); err != nil {
			return err
		}
	}
	if err := c.resolveComm(l); err != nil {
		return err
	}
	return c.checkMemReport(l)
}

// checkMemReport refuses --memory-report where it would do nothing: the
// ledger is the CUDA allocator's, kept by the one-rank, one-process run.
func (c *Config) checkMemReport(l origin) error {
	if !c.memReport {
		return nil
	}
	if c.Device == "cpu" {
		return fmt.Errorf("--memory-report: expected --device cuda or auto (it reports the CUDA allocator's blocks), found --device cpu")
	}
	if p := c.Parallel; l.launched || p.NProc > 0 || p.Processes() || !p.Single() {
		return fmt.Errorf("--memory-report: expected a run of one rank in one process, found %s over --comm %s", p, p.Comm)
	}
	return nil
}
