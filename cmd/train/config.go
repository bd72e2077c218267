package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// Config is everything one run of cmd/train needs. It is what --config reads
// (JSON) and what the run writes back to OUT/config.json. A preset fills it
// first, then the file's fields override the preset's, then flags override
// both.
type Config struct {
	Preset   string           `json:"preset"`
	Device   string           `json:"device"` // auto, cpu, cuda
	Data     string           `json:"data"`   // token files (package tokens), a list, a directory or a glob, as one stream; empty: the built-in corpus
	Model    layers.GPTConfig `json:"model"`
	Train    train.Config     `json:"train"`
	Parallel ParallelConfig   `json:"parallel"`
	// DataFormat is the format of every file of Data and ValData
	// (--data-format, tokens.Formats); empty or "auto": detected per file.
	DataFormat string `json:"data_format,omitempty"`
	// ValData is a separate validation set (--val-data), in place of the
	// held-out tail of Data (train.val_fraction).
	ValData string `json:"val_data,omitempty"`
	// Overlap chooses the strategy of each communication site (--overlap,
	// overlap.Config: {"default": ..., "sites": {...}}).
	Overlap overlap.Config `json:"overlap"`
	// Shadow is shadow mode (--shadow-every, overlap.ShadowConfig: {"every":
	// N, "sites": [...], "fail_above": X}; shadow.go); nil: off.
	Shadow *overlap.ShadowConfig `json:"shadow,omitempty"`
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
	// shards (--fused-transfer pull|put, peercopy.Engine.Transfer; empty:
	// $ASYNCTP_FUSED_TRANSFER, else pull; fusedtransfer.go).
	FusedTransfer string `json:"fused_transfer,omitempty"`
	// DumpRouting is a directory each rank writes every step's routing
	// into (--dump-routing, routing.go); empty: none.
	DumpRouting string `json:"dump_routing,omitempty"`
	// Resumed is the run's history: each resume, its step and what it
	// changed (resume.go). A record of the run that wrote it: --config
	// ignores it, a resume takes the checkpoint's.
	Resumed []Resume `json:"resumed,omitempty"`

	explicit   map[string]bool // the fields the file and the flags give (explicitFields)
	overwrite  bool            // --overwrite
	commWhy    string          // why --comm is what it is, when it was not given (resolveComm)
	memReport  bool            // --memory-report
	verbose    bool            // --verbose
	cpuProfile string          // --cpu-profile
	adopted    bool            // prepare has taken the model of the resume or --init-from
	resume     *resumeNote     // what a resume took and changed; nil for a new run
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
	fs := newFlagSet()
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q (flags start with -; see -help)", fs.Arg(0))
	}
	set := fs.given()
	configFile := fs.Lookup("config").Value.String()

	// The preset: the flag wins, then the file's "preset", then tiny.
	var file []byte
	name := fs.Lookup("model").Value.String()
	if configFile != "" {
		var err error
		if file, err = os.ReadFile(configFile); err != nil {
			return Config{}, fmt.Errorf("reading config: %w", err)
		}
		var head struct {
			Preset string `json:"preset"`
		}
		if err := json.Unmarshal(file, &head); err != nil {
			return Config{}, fmt.Errorf("config %s is not valid JSON: %w", configFile, err)
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
			return Config{}, fmt.Errorf("config %s: %w", configFile, err)
		}
		cfg.Preset = name
		named, err := explicitFields(file, nil)
		if err != nil {
			return Config{}, fmt.Errorf("config %s: %w", configFile, err)
		}
		if err := checkSeq(&cfg, named, configFile); err != nil {
			return Config{}, err
		}
	}
	fs.applyFlags(&cfg, set)
	var err error
	if cfg.explicit, err = explicitFields(file, set); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", configFile, err)
	}
	cfg.Resumed = nil // a record of the run that wrote the file
	delete(cfg.explicit, "resumed")
	if cfg.Train.Resume != "" {
		if err := resumeSettings(&cfg, set, l.launched || cfg.Parallel.NProc > 0); err != nil {
			return Config{}, err
		}
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
	if err := cfg.checkTakesEffect(set, &preset, configFile, l); err != nil {
		return cfg, err
	}
	return cfg, cfg.checkShadowEffect(set, configFile, l)
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
	if err := c.checkHeads(); err != nil {
		return err
	}
	if err := c.Model.Validate(); err != nil {
		return err
	}
	if err := c.Overlap.Validate(); err != nil {
		return err
	}
	if err := c.checkShadow(); err != nil {
		return err
	}
	if err := c.checkGrouped(); err != nil {
		return err
	}
	if c.Autotune && !usesAuto(c.Overlap) {
		return fmt.Errorf("--autotune: expected --overlap auto (or a site configured \"auto\"): no site would use the timings")
	}
	c.Model = c.Model.WithDefaults()
	if c.Train.Warmup > c.Train.Steps && c.Train.Steps > 0 && !c.explicit["train.warmup"] && c.resume == nil {
		c.Train.Warmup = c.Train.Steps
	}
	if err := c.checkData(); err != nil {
		return err
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
	if err := c.checkAccum(); err != nil {
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

// checkHeads checks the attention's head counts in the flags' terms
// before the model's own check (layers.GPTConfig.Validate, which speaks of
// its fields): --heads divides --dim into even head dims (RoPE turns
// pairs), and --kv-heads divides --heads.
func (c *Config) checkHeads() error {
	m := c.Model
	if m.Heads > 0 && m.Dim > 0 {
		if m.Dim%m.Heads != 0 {
			return fmt.Errorf("--heads %d: expected a divisor of --dim %d", m.Heads, m.Dim)
		}
		if hd := m.Dim / m.Heads; hd%2 != 0 {
			return fmt.Errorf("--dim %d over --heads %d: head dim %d, expected an even head dim (RoPE turns pairs of dims)", m.Dim, m.Heads, hd)
		}
	}
	if m.Heads > 0 && (m.KVHeads < 0 || m.KVHeads > 0 && m.Heads%m.KVHeads != 0) {
		return fmt.Errorf("--kv-heads %d: expected a divisor of --heads %d (each key/value head is read by --heads/--kv-heads query heads; 0 or left out: as many as --heads)", m.KVHeads, m.Heads)
	}
	return nil
}

// checkMemReport refuses --memory-report where it would do nothing: the
// ledger is the CUDA allocator's, kept by a run of one rank in one process
// or by each process of a world of GPU processes (rank 0 prints its own).
func (c *Config) checkMemReport(l origin) error {
	if !c.memReport {
		return nil
	}
	if c.Device == "cpu" {
		return fmt.Errorf("--memory-report: expected --device cuda or auto (it reports the CUDA allocator's blocks), found --device cpu")
	}
	p := c.Parallel
	gpuProcs := (l.launched || p.NProc > 0 || p.Processes()) && (p.Comm == CommNCCL || p.Comm == CommNVSHMEM)
	if !gpuProcs && (l.launched || p.NProc > 0 || p.Processes() || !p.Single()) {
		return fmt.Errorf("--memory-report: expected a run of one rank in one process, or GPU processes (--comm nccl or nvshmem), found %s over --comm %s", p, p.Comm)
	}
	return nil
}

func formatNames() string {
	var names []string
	for _, f := range tokens.Formats {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// checkData applies the rules of --data-format and --val-data: a format
// must be one of tokens.Formats and name files to read; a validation set
// of its own replaces the held-out tail of --data that a preset asks for,
// and is refused beside a --val-fraction given explicitly; it is evaluated
// every --eval-every steps over --eval-batches batches, both above 0.
func (c *Config) checkData() error {
	f, err := tokens.ParseFormat(c.DataFormat)
	if err != nil {
		return fmt.Errorf("--data-format: %w", err)
	}
	if f != tokens.Auto && c.Data == "" && c.ValData == "" {
		return fmt.Errorf("--data-format %s: no --data or --val-data file to read (the built-in corpus is text)", f)
	}
	if c.ValData == "" {
		return nil
	}
	t := &c.Train
	if t.ValFraction > 0 {
		if c.explicit["train.val_fraction"] {
			return fmt.Errorf("--val-data %s and --val-fraction %g: the validation set is a separate file or the held-out tail of --data, not both; give one (--val-fraction 0 keeps all of --data for training)", c.ValData, t.ValFraction)
		}
		t.ValFraction = 0 // the preset's held-out split gives way to the validation set
	}
	if t.EvalEvery <= 0 || t.EvalBatches <= 0 {
		return fmt.Errorf("--val-data %s: evaluated every %d steps over %d batches; give --eval-every and --eval-batches above 0", c.ValData, t.EvalEvery, t.EvalBatches)
	}
	return nil
}
