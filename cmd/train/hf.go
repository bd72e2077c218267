package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/hf"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/shard"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

// tokenizerDir, in an out dir, holds the tokenizer files of the model a
// run started from (--init-from), which train export copies on.
const tokenizerDir = "tokenizer"

// tokenizerFiles are the files of a Hugging Face tokenizer that travel
// with a model; sourceConfig is the copy of the model's config.json (for
// its token ids: bos, eos, pad).
var tokenizerFiles = []string{"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt", "generation_config.json", "asynctp_vocab.json"}

const sourceConfig = "source_config.json"

// The tokenizer kinds of state.json (train.WithTokenizer).
const (
	tokBytes = "bytes"     // text data: one token per byte
	tokIDs   = "token ids" // token files (not text) of an unnamed tokenizer
)

// initFromModel is the model of the --init-from directory, at the run's
// sequence length: the one given, else the preset's, at most the model's
// max_position_embeddings.
func initFromModel(cfg *Config) (layers.GPTConfig, error) {
	c, err := hf.ReadConfig(cfg.InitFrom)
	if err != nil {
		return layers.GPTConfig{}, fmt.Errorf("--init-from: %w", err)
	}
	seq := cfg.Model.Seq
	if !cfg.explicit["model.seq"] && c.MaxPositionEmbeddings > 0 {
		seq = min(seq, c.MaxPositionEmbeddings)
	}
	m, err := c.Model(seq)
	if err != nil {
		return m, fmt.Errorf("--init-from %s: %w", cfg.InitFrom, err)
	}
	return m, nil
}

// initWeights sets the parameters ps (a rank at pl of the model cfg.Model,
// on b) from the --init-from directory.
func initWeights(cfg Config, b tensor.Backend, ps *layers.ParamSet, pl hf.Placement) error {
	if cfg.InitFrom == "" {
		return nil
	}
	c, err := hf.ReadConfig(cfg.InitFrom)
	if err != nil {
		return err
	}
	full, err := hf.ReadWeights(cfg.InitFrom, c, cfg.Model)
	if err != nil {
		return fmt.Errorf("--init-from: %w", err)
	}
	for _, p := range ps.Params() {
		f, ok := full[p.Name]
		if !ok {
			return fmt.Errorf("--init-from: the model has no %s", p.Name)
		}
		s, err := hf.Shard(cfg.Model, p.Name, f, p.Shape(), pl)
		if err != nil {
			return fmt.Errorf("--init-from: %w", err)
		}
		h, err := castHost(s, p.W.DType())
		if err != nil {
			return fmt.Errorf("--init-from: %s: %w", p.Name, err)
		}
		b.Upload(p.W, h)
	}
	if err := b.Err(); err != nil {
		return fmt.Errorf("--init-from: %w", err)
	}
	return nil
}

// castHost converts a float32 host tensor to dt.
func castHost(t *tensor.Tensor, dt tensor.DType) (*tensor.Tensor, error) {
	switch dt {
	case tensor.Float32:
		return t, nil
	case tensor.BFloat16:
		h, err := tensor.Host(dt, t.Shape()...)
		if err != nil {
			return nil, err
		}
		for i, v := range t.F32() {
			h.BF16()[i] = tensor.BF16FromFloat32(v)
		}
		return h, nil
	}
	v := make([]float64, t.Numel())
	for i, x := range t.F32() {
		v[i] = float64(x)
	}
	return tensor.FromFloat64(v, t.Shape()...)
}

// olderTokenizerNames are the names that earlier checkpoints gave a
// tokenizer kind (a resume accepts them).
var olderTokenizerNames = map[string][]string{tokIDs: {"uint16 ids"}}

// tokenizerOf says what the run's token ids are (those of ds), and refuses
// text data (read as bytes) for a model that comes with a tokenizer of its
// own.
func tokenizerOf(cfg Config, ds *tokens.Stream) (string, error) {
	kind := tokBytes
	if !ds.Text() {
		kind = tokIDs
	}
	if cfg.InitFrom == "" {
		return kind, nil
	}
	if b, err := os.ReadFile(filepath.Join(cfg.InitFrom, "asynctp_vocab.json")); err == nil && strings.Contains(string(b), `"bytes"`) {
		return kind, nil // our byte-level vocabulary: text, or ids given as they are
	}
	for _, f := range []string{"tokenizer.json", "tokenizer.model"} {
		b, err := os.ReadFile(filepath.Join(cfg.InitFrom, f))
		if err != nil {
			continue
		}
		sum := sha256.Sum256(b)
		id := "hf " + f + " sha256 " + hex.EncodeToString(sum[:8])
		if kind == tokBytes {
			return "", fmt.Errorf("--init-from %s: the model has its own tokenizer (%s), but text data is read here one byte per token; tokenize the data with that tokenizer into token ids (a .bin of uint16, a .u32 of uint32, an llm.c shard or a Megatron dataset) and give them with --data", cfg.InitFrom, f)
		}
		return id, nil
	}
	return kind, nil // a model without tokenizer files: the data's ids are taken as they are
}

// copyTokenizer copies the --init-from directory's tokenizer files and its
// config.json into OUT/tokenizer.
func copyTokenizer(cfg Config) error {
	if cfg.InitFrom == "" {
		return nil
	}
	dst := filepath.Join(cfg.Train.OutDir, tokenizerDir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, f := range append(tokenizerFiles, hf.ConfigFile) {
		b, err := os.ReadFile(filepath.Join(cfg.InitFrom, f))
		if err != nil {
			continue
		}
		name := f
		if f == hf.ConfigFile {
			name = sourceConfig
		}
		if err := train.WriteFileAtomic(filepath.Join(dst, name), b); err != nil {
			return err
		}
	}
	return nil
}

// runCheckpoints returns the checkpoints of the newest state of the run
// in dir that a resume reads (train.RunCheckpoints: one per rank of the run
// that wrote it, the newest step every one of them holds, whatever layouts
// wrote the rank dirs), rank 0's first, and their states.
func runCheckpoints(dir string) (cks []string, states []*train.State, err error) {
	if cks, err = train.RunCheckpoints(dir); err != nil {
		return nil, nil, err
	}
	for _, ck := range cks {
		st, err := train.ReadState(filepath.Join(ck, train.StateFile))
		if err != nil {
			return nil, nil, err
		}
		states = append(states, st)
	}
	return cks, states, nil
}

// consolidateRun reads the newest state of the run in dir (runCheckpoints)
// and returns its model config, its full parameters (float32 host tensors
// by our names) and the checkpoints' states. Each rank's tensors are
// placed by the slices its checkpoint records (shard.RecordedSlices;
// none: whole), a distributed optimizer's runs of a tensor (train.RunsKey)
// first put together over the ranks that hold them, as a resume reads
// them; every parameter of the config must be there whole, and nothing
// else.
func consolidateRun(dir string) (layers.GPTConfig, map[string]*tensor.Tensor, []*train.State, error) {
	var mc layers.GPTConfig
	cks, states, err := runCheckpoints(dir)
	if err != nil {
		return mc, nil, nil, err
	}
	if err := json.Unmarshal(states[0].ModelConfig, &mc); err != nil || mc.Layers == 0 {
		return mc, nil, nil, fmt.Errorf("%s: state.json has no model_config to export by", cks[0])
	}
	shapes := map[string][]int{}
	for _, p := range hf.Params(mc) {
		shapes[p.Name] = p.Shape
	}
	var pieces []shard.Piece
	runs := newRunAssembly()
	for i, ck := range cks {
		name := filepath.Join(ck, train.ModelFile)
		data, err := os.ReadFile(name)
		if err != nil {
			return mc, nil, nil, err
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != states[i].Files[train.ModelFile] {
			return mc, nil, nil, fmt.Errorf("%s is corrupted: sha256 %s, expected %s", name, got, states[i].Files[train.ModelFile])
		}
		sf, err := safetensors.Read(data)
		if err != nil {
			return mc, nil, nil, fmt.Errorf("%s: %w", name, err)
		}
		recorded, err := shard.RecordedSlices(name, sf)
		if err != nil {
			return mc, nil, nil, err
		}
		recs := map[string]runRecord{}
		if js, ok := sf.Metadata[train.RunsKey]; ok {
			if err := json.Unmarshal([]byte(js), &recs); err != nil {
				return mc, nil, nil, fmt.Errorf("%s: metadata %s: %w", name, train.RunsKey, err)
			}
		}
		for _, n := range sf.Names() {
			t, err := sf.Entries[n].Tensor()
			if err != nil {
				return mc, nil, nil, fmt.Errorf("%s: %w", name, err)
			}
			if rec, ok := recs[n]; ok {
				if err := runs.add(name, n, rec, t, shapes); err != nil {
					return mc, nil, nil, err
				}
				continue
			}
			sl, ok := recorded[n]
			if !ok {
				sl = shard.Slice{Full: t.Shape().Clone(), Dim: -1}
			}
			pieces = append(pieces, shard.Piece{Name: n, Slice: sl, Tensor: t})
		}
	}
	assembled, err := runs.pieces()
	if err != nil {
		return mc, nil, nil, err
	}
	merged, err := shard.Merge(append(pieces, assembled...))
	if err != nil {
		return mc, nil, nil, err
	}
	full := map[string]*tensor.Tensor{}
	for _, p := range hf.Params(mc) {
		t, ok := merged[p.Name]
		switch {
		case !ok:
			return mc, nil, nil, fmt.Errorf("the checkpoints of %s hold no %s, which the model of their config has", dir, p.Name)
		case !t.Shape().Equal(p.Shape):
			return mc, nil, nil, fmt.Errorf("the checkpoints of %s hold %s of shape %v, the model of their config has %v", dir, p.Name, t.Shape(), p.Shape)
		}
		if full[p.Name], err = tensor.ToFloat32(t); err != nil {
			return mc, nil, nil, fmt.Errorf("%s: %w", p.Name, err)
		}
	}
	for n := range merged {
		if _, ok := full[n]; !ok {
			return mc, nil, nil, fmt.Errorf("the checkpoints of %s hold %s, which the model of their config does not have", dir, n)
		}
	}
	return mc, full, states, nil
}

// runRecord is a checkpoint's record of a tensor that is a run of a
// parameter's elements (train.RunsKey).
type runRecord struct {
	Tensor string       `json:"tensor"` // the parameter's name
	Lo     int          `json:"lo"`     // the run [Lo, Hi) of its elements, row-major
	Hi     int          `json:"hi"`
	Numel  int          `json:"numel"`           // the elements of the rank's whole tensor
	Slice  *shard.Slice `json:"slice,omitempty"` // the rank's slice of the full tensor (nil: whole)
}

// runAssembly puts the runs of each (parameter, slice) together.
type runAssembly struct {
	order []string
	parts map[string]*runParts
}

type runParts struct {
	name    string
	slice   shard.Slice
	t       *tensor.Tensor // the slice's tensor, filled by the runs
	covered []bool
	from    string // the first file, for messages
}

func newRunAssembly() *runAssembly { return &runAssembly{parts: map[string]*runParts{}} }

// add puts the run t (named n in file, recorded as rec) in place.
func (a *runAssembly) add(file, n string, rec runRecord, t *tensor.Tensor, shapes map[string][]int) error {
	sl := shard.Slice{Dim: -1}
	if rec.Slice != nil {
		sl = *rec.Slice
	} else if full, ok := shapes[rec.Tensor]; ok {
		sl.Full = full
	} else {
		return fmt.Errorf("%s: %s is a run of %s, which the model of its config does not have", file, n, rec.Tensor)
	}
	key := fmt.Sprintf("%s %v %d %d %d", rec.Tensor, sl.Full, sl.Dim, sl.Lo, sl.Hi)
	p := a.parts[key]
	if p == nil {
		whole, err := tensor.Host(t.DType(), sl.Shape()...)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", file, n, err)
		}
		p = &runParts{name: rec.Tensor, slice: sl, t: whole, covered: make([]bool, whole.Numel()), from: file}
		a.parts[key] = p
		a.order = append(a.order, key)
	}
	if rec.Numel != p.t.Numel() || rec.Lo < 0 || rec.Hi > rec.Numel || rec.Hi-rec.Lo != t.Numel() || t.DType() != p.t.DType() {
		return fmt.Errorf("%s: %s (%v, %d elements) is recorded as the run [%d, %d) of the %d elements of %s, expected a run of its %v %v of %d elements (%s)",
			file, n, t.DType(), t.Numel(), rec.Lo, rec.Hi, rec.Numel, rec.Tensor, p.t.DType(), p.slice.Shape(), p.t.Numel(), p.from)
	}
	dst, err := p.t.View(rec.Lo, rec.Hi-rec.Lo)
	if err != nil {
		return err
	}
	vals, err := t.Float64s() // exact for every float dtype, back and forth
	if err == nil {
		err = dst.SetFloat64s(vals)
	}
	if err != nil {
		return fmt.Errorf("%s: %s: %w", file, n, err)
	}
	for i := rec.Lo; i < rec.Hi; i++ {
		p.covered[i] = true
	}
	return nil
}

// pieces are the assembled slices; each must be covered by its runs.
func (a *runAssembly) pieces() ([]shard.Piece, error) {
	var out []shard.Piece
	for _, key := range a.order {
		p := a.parts[key]
		if i := slices.Index(p.covered, false); i >= 0 {
			return nil, fmt.Errorf("the runs of %s (its slice %v of %v) leave element %d of %d uncovered (%s)", p.name, p.slice.Shape(), p.slice.Full, i, len(p.covered), p.from)
		}
		out = append(out, shard.Piece{Name: p.name, Slice: p.slice, Tensor: p.t})
	}
	return out, nil
}

// runExport is "train export --from RUN --out DIR".
func runExport(args []string) error {
	fs := flag.NewFlagSet("train export", flag.ContinueOnError)
	from := fs.String("from", "", "a run's out dir (any layout; its newest state, as --resume reads it: the newest step every rank holds) or a checkpoint `dir`")
	out := fs.String("out", "", "the Hugging Face model `dir` to write (config.json, model.safetensors, the vocabulary)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: train export --from RUN --out DIR\n\nwrites a transformers model directory (LlamaForCausalLM, or MixtralForCausalLM for MoE) from a checkpoint of any layout:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("export: expected --from RUN --out DIR and nothing else, found %q", args)
	}
	mc, full, states, err := consolidateRun(*from)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	runDir := resumeOutDir(*from)
	extra := map[string]any{}
	if b, err := os.ReadFile(filepath.Join(runDir, tokenizerDir, sourceConfig)); err == nil {
		var src map[string]any
		if json.Unmarshal(b, &src) == nil {
			for _, k := range []string{"bos_token_id", "eos_token_id", "pad_token_id"} {
				if v, ok := src[k]; ok {
					extra[k] = v
				}
			}
		}
	}
	if err := hf.WriteDir(*out, mc, full, extra); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	vocab := "no vocabulary file (the run's data were token ids of an unnamed tokenizer)"
	if ents, err := os.ReadDir(filepath.Join(runDir, tokenizerDir)); err == nil && len(ents) > 0 {
		for _, e := range ents {
			if e.Name() == sourceConfig {
				continue
			}
			if err := copyFile(filepath.Join(runDir, tokenizerDir, e.Name()), filepath.Join(*out, e.Name())); err != nil {
				return fmt.Errorf("export: %w", err)
			}
		}
		vocab = "the tokenizer of the model the run started from"
	} else if states[0].Tokenizer == tokBytes || states[0].Tokenizer == "" && mc.Vocab >= 256 {
		if err := writeByteTokenizer(*out, mc); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		vocab = "the byte-level vocabulary (tokenizer.json: token i is byte i)"
	}
	fmt.Printf("export: %s at step %d (%d checkpoint files) → %s: config.json (%s), model.safetensors, %s\n",
		*from, states[0].Step, len(states), *out, map[bool]string{false: "LlamaForCausalLM", true: "MixtralForCausalLM"}[mc.Experts > 0], vocab)
	return nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return train.WriteFileAtomic(dst, b)
}

// writeByteTokenizer writes the byte-level vocabulary as a tokenizers
// tokenizer.json (a ByteLevel BPE without merges: token i is byte i) and
// asynctp_vocab.json, which --init-from reads back.
func writeByteTokenizer(dir string, mc layers.GPTConfig) error {
	vocab := map[string]int{}
	for b, r := range byteUnicode() {
		vocab[string(r)] = b
	}
	tok := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": []any{}, "normalizer": nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []any{}},
	}
	files := map[string]any{
		"tokenizer.json":        tok,
		"tokenizer_config.json": map[string]any{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": mc.Seq, "clean_up_tokenization_spaces": false},
		"asynctp_vocab.json":    map[string]any{"type": "bytes", "vocab_size": mc.Vocab, "note": "token i < 256 is byte i"},
	}
	for name, v := range files {
		js, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			return err
		}
		if err := train.WriteFileAtomic(filepath.Join(dir, name), append(js, '\n')); err != nil {
			return err
		}
	}
	return nil
}

// byteUnicode is GPT-2's bytes_to_unicode: the printable character that
// stands for each byte in a byte-level BPE vocabulary.
func byteUnicode() [256]rune {
	var m [256]rune
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}

// runLogits is "train logits --from MODEL --data tokens.bin --batch B
// --seq T --out FILE": the logits of the model (a run or checkpoint of any
// layout, or a Hugging Face directory) on the first B windows of T tokens
// of the data (window i is tokens [i·T, i·T+T]), on the CPU in float32,
// written as a safetensors file with "logits" (B, T, V), "ids" (B, T) and
// "loss" (1, the mean cross-entropy against the next tokens).
func runLogits(args []string) error {
	fs := flag.NewFlagSet("train logits", flag.ContinueOnError)
	from := fs.String("from", "", "a run, a checkpoint, or a Hugging Face model `dir`")
	data := fs.String("data", "", "token files, as train's --data takes them")
	format := fs.String("data-format", string(tokens.Auto), "format of the --data files: "+formatNames())
	B := fs.Int("batch", 1, "windows")
	T := fs.Int("seq", 0, "tokens per window (default: the model's seq)")
	out := fs.String("out", "", "the safetensors `file` to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || *data == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("logits: expected --from DIR --data FILE --out FILE [--batch B --seq T], found %q", args)
	}
	var mc layers.GPTConfig
	var full map[string]*tensor.Tensor
	if isHFDir(*from) {
		c, err := hf.ReadConfig(*from)
		if err != nil {
			return err
		}
		if mc, err = c.Model(max(*T, 1)); err != nil {
			return err
		}
		if full, err = hf.ReadWeights(*from, c, mc); err != nil {
			return err
		}
	} else {
		var err error
		if mc, full, _, err = consolidateRun(*from); err != nil {
			return fmt.Errorf("logits: %w", err)
		}
	}
	if *T == 0 {
		*T = mc.Seq
	}
	mc.Seq = max(mc.Seq, *T)
	ds, err := tokens.Open(*data, tokens.Format(*format))
	if err != nil {
		return dataError("logits --data", err)
	}
	defer ds.Close()
	if ds.Len() < int64(*B**T+1) {
		return fmt.Errorf("logits: %s has %d tokens, expected at least batch × seq + 1 = %d", ds.Name(), ds.Len(), *B**T+1)
	}
	toks := make([]int32, *B**T+1)
	if err := ds.Read(toks, 0); err != nil {
		return err
	}
	for i, v := range toks {
		if int(v) >= mc.Vocab {
			return fmt.Errorf("logits: %s holds token id %d at position %d, but the model's vocabulary has %d ids", ds.Name(), v, i, mc.Vocab)
		}
	}
	b := cpu.New()
	g, err := layers.NewGPT(b, mc, tensor.Float32)
	if err != nil {
		return err
	}
	for _, p := range g.Params().Params() {
		b.Upload(p.W, full[p.Name])
	}
	ids, tg := make([]int32, *B**T), make([]int32, *B**T)
	for i := range ids {
		w, t := i / *T, i%*T
		ids[i], tg[i] = toks[w**T+t], toks[w**T+t+1]
	}
	idT, _ := tensor.FromInt32(ids, *B, *T)
	tgT, _ := tensor.FromInt32(tg, *B, *T)
	loss, err := g.Forward(idT, tgT)
	if err != nil {
		return err
	}
	logits, err := tensor.Host(tensor.Float32, *B, *T, mc.Vocab)
	if err != nil {
		return err
	}
	b.Download(logits, g.Logits())
	ce := loss - g.AuxLoss()
	lt, _ := tensor.FromFloat32([]float32{float32(ce)}, 1)
	if err := safetensors.WriteFile(*out, []safetensors.Named{{Name: "logits", Tensor: logits}, {Name: "ids", Tensor: idT}, {Name: "loss", Tensor: lt}}, map[string]string{"format": "pt"}); err != nil {
		return err
	}
	fmt.Printf("logits: %s on %d × %d tokens of %s: loss %.6f → %s\n", *from, *B, *T, *data, ce, *out)
	return nil
}

// isHFDir reports whether dir is a transformers model directory (weights
// at its top), not a run or a checkpoint of ours.
func isHFDir(dir string) bool {
	for _, f := range []string{hf.WeightsFile, hf.IndexFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			if _, err := os.Stat(filepath.Join(dir, train.StateFile)); err != nil {
				return true
			}
		}
	}
	return false
}
