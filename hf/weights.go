package hf

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/train"
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
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	if len(data) < 8 {
		return fmt.Errorf("hf: %s: %d bytes, too short for a safetensors file", path, len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > uint64(len(data)-8) || n > train.MaxSafetensorsHeader {
		return fmt.Errorf("hf: %s: header length %d, but the file has %d bytes after it", path, n, len(data)-8)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &hdr); err != nil {
		return fmt.Errorf("hf: %s: header: %w", path, err)
	}
	body := data[8+n:]
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var e struct {
			DType   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil || len(e.Offsets) != 2 {
			return fmt.Errorf("hf: %s: tensor %q: bad header entry %s", path, name, raw)
		}
		numel := 1
		for _, d := range e.Shape {
			if d < 0 {
				return fmt.Errorf("hf: %s: tensor %q has shape %v", path, name, e.Shape)
			}
			numel *= d
		}
		size := map[string]int{"F32": 4, "F16": 2, "BF16": 2, "F64": 8}[e.DType]
		if size == 0 {
			return fmt.Errorf("hf: %s: tensor %q is %s, expected F32, F16, BF16 or F64", path, name, e.DType)
		}
		lo, hi := e.Offsets[0], e.Offsets[1]
		if lo > hi || hi > uint64(len(body)) || hi-lo != uint64(numel*size) {
			return fmt.Errorf("hf: %s: tensor %q: offsets [%d, %d) for %d × %d bytes in a data section of %d", path, name, lo, hi, numel, size, len(body))
		}
		b := body[lo:hi]
		vals := make([]float32, numel)
		for i := range vals {
			switch e.DType {
			case "F32":
				vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			case "F64":
				vals[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
			case "BF16":
				vals[i] = tensor.BF16ToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
			case "F16":
				vals[i] = halfToFloat32(binary.LittleEndian.Uint16(b[2*i:]))
			}
		}
		if _, dup := into[name]; dup {
			return fmt.Errorf("hf: tensor %q is in two weight files (%s, %s)", name, into[name].file, path)
		}
		into[name] = &entry{file: filepath.Base(path), shape: e.Shape, vals: vals}
	}
	return nil
}

// halfToFloat32 decodes an IEEE 754 half-precision value.
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal
		f := float32(frac) / 1024 / 16384
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
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
// skipped when the embeddings are tied). The k and v projections of a
// grouped-query model are repeated for each head of their group.
func ReadWeights(dir string, c Config, m layers.GPTConfig) (map[string]*tensor.Tensor, error) {
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
	m = m.WithDefaults()
	D := m.Dim / m.Heads
	group := m.Heads / c.NumKeyValueHeads
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
		case group > 1 && (strings.HasSuffix(p.Name, ".attn.wk.weight") || strings.HasSuffix(p.Name, ".attn.wv.weight")):
			v := take(hfName(p), []int{c.NumKeyValueHeads * D, m.Dim})
			if v != nil {
				for h := range m.Heads { // query head h reads key/value head h / group
					copy(full[h*D*m.Dim:(h+1)*D*m.Dim], v[h/group*D*m.Dim:])
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
	var nts []train.NamedTensor
	for _, p := range Params(m) {
		t, ok := full[p.Name]
		if !ok || !slices.Equal([]int(t.Shape()), p.Shape) {
			return fmt.Errorf("hf: parameter %s missing or not of shape %v", p.Name, p.Shape)
		}
		t, err := toF32(t)
		if err != nil {
			return fmt.Errorf("hf: parameter %s: %w", p.Name, err)
		}
		if !p.Expert {
			nts = append(nts, train.NamedTensor{Name: hfName(p), Tensor: t})
			continue
		}
		per := p.Shape[1] * p.Shape[2]
		for e := range p.Shape[0] {
			et, err := tensor.FromFloat32(t.F32()[e*per:(e+1)*per], p.Shape[1:]...)
			if err != nil {
				return err
			}
			nts = append(nts, train.NamedTensor{Name: fmt.Sprintf(hfName(p), e), Tensor: et})
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := train.WriteFileAtomic(filepath.Join(dir, ConfigFile), append(js, '\n')); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, WeightsFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = train.WriteSafetensors(bw, nts, map[string]string{"format": "pt"})
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("hf: writing %s: %w", filepath.Join(dir, WeightsFile), err)
	}
	return nil
}

// toF32 returns t as a float32 host tensor.
func toF32(t *tensor.Tensor) (*tensor.Tensor, error) {
	switch t.DType() {
	case tensor.Float32:
		return t, nil
	case tensor.BFloat16:
		v := make([]float32, t.Numel())
		for i, h := range t.BF16() {
			v[i] = tensor.BF16ToFloat32(h)
		}
		return tensor.FromFloat32(v, t.Shape()...)
	}
	f, err := t.Float64s()
	if err != nil {
		return nil, err
	}
	v := make([]float32, len(f))
	for i, x := range f {
		v[i] = float32(x)
	}
	return tensor.FromFloat32(v, t.Shape()...)
}
