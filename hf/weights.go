package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/internal/atomicfile"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// The weight files of a model directory.
const (
	WeightsFile = "model.safetensors"
	IndexFile   = "model.safetensors.index.json" // a model split over several files
)

// entry is one tensor of a safetensors file, as float32.
type entry struct {
	file  string
	shape []int
	vals  []float32
}

// readSafetensors reads every tensor of a safetensors file as float32
// (F32, F16, BF16 or F64).
func readSafetensors(path string, into map[string]*entry) error {
	f, err := safetensors.ReadFile(path)
	if err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	for _, name := range f.Names() {
		vals, err := f.Entries[name].Float32s()
		if err != nil {
			return fmt.Errorf("hf: %s: %w", path, err)
		}
		if _, dup := into[name]; dup {
			return fmt.Errorf("hf: tensor %q is in two weight files (%s, %s)", name, into[name].file, path)
		}
		into[name] = &entry{file: filepath.Base(path), shape: f.Entries[name].Shape, vals: vals}
	}
	return nil
}

// readAll reads every tensor of the model in dir: model.safetensors, or the
// files model.safetensors.index.json names.
func readAll(dir string) (map[string]*entry, error) {
	all := map[string]*entry{}
	idx, err := os.ReadFile(filepath.Join(dir, IndexFile))
	switch {
	case err == nil:
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(idx, &ix); err != nil {
			return nil, fmt.Errorf("hf: %s: %w", filepath.Join(dir, IndexFile), err)
		}
		var files []string
		for _, f := range ix.WeightMap {
			if !slices.Contains(files, f) {
				files = append(files, f)
			}
		}
		sort.Strings(files)
		for _, f := range files {
			if err := readSafetensors(filepath.Join(dir, filepath.Base(f)), all); err != nil {
				return nil, err
			}
		}
	case errors.Is(err, fs.ErrNotExist):
		path := filepath.Join(dir, WeightsFile)
		if _, err := os.Stat(path); err != nil {
			if _, perr := os.Stat(filepath.Join(dir, "pytorch_model.bin")); perr == nil {
				return nil, fmt.Errorf("hf: %s holds pytorch_model.bin, a pickle, which is not read here; save the model with save_pretrained(dir, safe_serialization=True) for model.safetensors", dir)
			}
			return nil, fmt.Errorf("hf: %s has neither %s nor %s", dir, WeightsFile, IndexFile)
		}
		if err := readSafetensors(path, all); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("hf: %w", err)
	}
	return all, nil
}

// ReadWeights reads the weights of the transformers model in dir, whose
// config is c, as the full parameters of our model m (m = c.Model(seq)):
// float32 host tensors by our names. Every tensor our model needs must be
// there with its shape, and every tensor there must be used (rotary
// inv_freq buffers of old checkpoints are skipped; lm_head.weight is
// skipped when the embeddings are tied). A grouped-query model's k and v
// projections (num_key_value_heads heads) are taken as they are: m has as
// many key/value heads.
func ReadWeights(dir string, c Config, m layers.GPTConfig) (map[string]*tensor.Tensor, error) {
	m = m.WithDefaults()
	if m.KVHeads != c.NumKeyValueHeads {
		return nil, fmt.Errorf("hf: the model has %d key/value heads, its config.json %d (num_key_value_heads): expected the model of c.Model", m.KVHeads, c.NumKeyValueHeads)
	}
	all, err := readAll(dir)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	var problems []string
	take := func(name string, shape []int) []float32 {
		e, ok := all[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is missing (expected shape %v)", name, shape))
			return nil
		}
		used[name] = true
		if !slices.Equal(e.shape, shape) {
			problems = append(problems, fmt.Sprintf("%s has shape %v, expected %v", name, e.shape, shape))
			return nil
		}
		return e.vals
	}
	out := map[string]*tensor.Tensor{}
	for _, p := range Params(m) {
		full := make([]float32, tensor.Shape(p.Shape).Numel())
		switch {
		case p.Expert:
			per := p.Shape[1] * p.Shape[2]
			for e := range p.Shape[0] {
				if v := take(fmt.Sprintf(hfName(p), e), p.Shape[1:]); v != nil {
					copy(full[e*per:], v)
				}
			}
		default:
			if v := take(hfName(p), p.Shape); v != nil {
				copy(full, v)
			}
		}
		t, err := tensor.FromFloat32(full, p.Shape...)
		if err != nil {
			return nil, err
		}
		out[p.Name] = t
	}
	var extra []string
	for name := range all {
		if !used[name] && !strings.HasSuffix(name, "rotary_emb.inv_freq") && !(m.TiedEmbeddings && name == "lm_head.weight") {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	if len(extra) > 5 {
		extra = append(extra[:5], fmt.Sprintf("and %d more", len(extra)-5))
	}
	if len(extra) > 0 {
		problems = append(problems, "tensors our model does not have: "+strings.Join(extra, ", "))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("hf: the weights in %s do not fit the model of its config.json: %s", dir, strings.Join(problems, "; "))
	}
	return out, nil
}

// WriteDir writes a transformers model directory: config.json (ConfigOf m,
// with extra's fields added, e.g. bos_token_id) and model.safetensors with
// the transformers names, float32. full holds our full parameters by name
// (Params(m)).
func WriteDir(dir string, m layers.GPTConfig, full map[string]*tensor.Tensor, extra map[string]any) error {
	c, err := ConfigOf(m)
	if err != nil {
		return err
	}
	for k, v := range extra {
		if _, ours := c[k]; !ours {
			c[k] = v
		}
	}
	var nts []safetensors.Named
	for _, p := range Params(m) {
		t, ok := full[p.Name]
		if !ok || !slices.Equal([]int(t.Shape()), p.Shape) {
			return fmt.Errorf("hf: parameter %s missing or not of shape %v", p.Name, p.Shape)
		}
		t, err := tensor.ToFloat32(t)
		if err != nil {
			return fmt.Errorf("hf: parameter %s: %w", p.Name, err)
		}
		if !p.Expert {
			nts = append(nts, safetensors.Named{Name: hfName(p), Tensor: t})
			continue
		}
		per := p.Shape[1] * p.Shape[2]
		for e := range p.Shape[0] {
			et, err := tensor.FromFloat32(t.F32()[e*per:(e+1)*per], p.Shape[1:]...)
			if err != nil {
				return err
			}
			nts = append(nts, safetensors.Named{Name: fmt.Sprintf(hfName(p), e), Tensor: et})
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, ConfigFile), append(js, '\n')); err != nil {
		return fmt.Errorf("hf: writing %s: %w", filepath.Join(dir, ConfigFile), err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, WeightsFile), nts, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}
