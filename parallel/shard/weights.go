package shard

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/asynctp/asynctp/safetensors"
	"github.com/asynctp/asynctp/tensor"
)

// SlicesKey is the metadata key under which SaveWeights records, as JSON,
// the Slice of every tensor of the file that is not whole.
const SlicesKey = "asynctp.slices"

// SaveWeights writes this rank's parameters, as described by shards, to a
// safetensors file at path (atomically: safetensors.WriteFile), each under
// its parameter's name, in the parameters' dtype; the slice of every split
// one is recorded in the metadata (SlicesKey), so MergeFiles can put the
// ranks' files together and LoadWeights can check a file against a layout.
// Weights only: no optimizer state (train's checkpoints hold that).
func SaveWeights(path string, b tensor.Backend, shards []Shard) error {
	if b == nil {
		return fmt.Errorf("shard: saving %s: nil backend", path)
	}
	var nts []safetensors.Named
	slices := map[string]Slice{}
	for _, s := range shards {
		if err := s.Check(); err != nil {
			return fmt.Errorf("shard: saving %s: %w", path, err)
		}
		if s.Param.W == nil {
			return fmt.Errorf("shard: saving %s: parameter %q is not materialized", path, s.Param.Name)
		}
		h, err := tensor.Host(s.Param.W.DType(), s.Param.W.Shape()...)
		if err != nil {
			return fmt.Errorf("shard: saving %s: %w", path, err)
		}
		b.Download(h, s.Param.W)
		if err := b.Err(); err != nil {
			return fmt.Errorf("shard: saving %s: parameter %q: %w", path, s.Param.Name, err)
		}
		nts = append(nts, safetensors.Named{Name: s.Param.Name, Tensor: h})
		if !s.Replicated() {
			slices[s.Param.Name] = s.Slice()
		}
	}
	meta := map[string]string{"format": "asynctp"}
	if len(slices) > 0 {
		js, err := json.Marshal(slices)
		if err != nil {
			return fmt.Errorf("shard: saving %s: %w", path, err)
		}
		meta[SlicesKey] = string(js)
	}
	if err := safetensors.WriteFile(path, nts, meta); err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	return nil
}

// RecordedSlices returns the slices the safetensors file f (read from
// path) records for its tensors (SlicesKey: SaveWeights', and train's
// checkpoints'), by name, each checked against its tensor's shape; a
// tensor it does not name is whole.
func RecordedSlices(path string, f *safetensors.File) (map[string]Slice, error) {
	return fileSlices(path, f)
}

// fileSlices reads the slices a file records (SlicesKey).
func fileSlices(path string, f *safetensors.File) (map[string]Slice, error) {
	out := map[string]Slice{}
	js, ok := f.Metadata[SlicesKey]
	if !ok {
		return out, nil
	}
	if err := json.Unmarshal([]byte(js), &out); err != nil {
		return nil, fmt.Errorf("shard: %s: metadata %s: %w", path, SlicesKey, err)
	}
	for name, s := range out {
		e, ok := f.Entries[name]
		if !ok {
			return nil, fmt.Errorf("shard: %s: metadata %s names %q, which the file does not hold", path, SlicesKey, name)
		}
		if err := s.check(); err != nil || s.Whole() || !s.Shape().Equal(e.Shape) {
			return nil, fmt.Errorf("shard: %s: metadata %s gives %q the slice %s of %v, which does not fit its shape %v", path, SlicesKey, name, describe(s), s.Full, e.Shape)
		}
	}
	return out, nil
}

// LoadWeights reads the safetensors file at path into this rank's
// parameters, as described by shards. For each parameter the file holds
// either the full tensor (its shape is the shard's Full: the rank's slice
// is cut out of it, so full weights load into any layout) or exactly this
// rank's slice (a file of SaveWeights of the same layout). Every parameter
// must be there and every tensor of the file must be used; the dtype is
// converted on upload. Everything is checked before anything is written:
// on error the parameters are unchanged.
func LoadWeights(path string, b tensor.Backend, shards []Shard) error {
	if b == nil {
		return fmt.Errorf("shard: loading %s: nil backend", path)
	}
	f, err := safetensors.ReadFile(path)
	if err != nil {
		return fmt.Errorf("shard: loading weights: %w", err)
	}
	recorded, err := fileSlices(path, f)
	if err != nil {
		return err
	}
	type upload struct {
		dst, src *tensor.Tensor
	}
	var ups []upload
	used := map[string]bool{}
	var problems []string
	for _, s := range shards {
		if err := s.Check(); err != nil {
			return fmt.Errorf("shard: loading %s: %w", path, err)
		}
		if s.Param.W == nil {
			return fmt.Errorf("shard: loading %s: parameter %q is not materialized", path, s.Param.Name)
		}
		name := s.Param.Name
		e, ok := f.Entries[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is missing (expected shape %v, or %v for the full tensor)", name, s.Param.Shape(), s.Full))
			continue
		}
		used[name] = true
		src, err := e.Tensor()
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		switch rec, isSlice := recorded[name]; {
		case !isSlice && e.Shape.Equal(s.Full):
			if !s.Replicated() {
				if src, err = Cut(src, s.Slice()); err != nil {
					problems = append(problems, fmt.Sprintf("%s: %v", name, err))
					continue
				}
			}
		case isSlice && rec.Equal(s.Slice()):
		case isSlice:
			problems = append(problems, fmt.Sprintf("%s is the slice %s of %v, this rank holds %s", name, describe(rec), rec.Full, describe(s.Slice())))
			continue
		default:
			problems = append(problems, fmt.Sprintf("%s has shape %v, expected the full %v", name, e.Shape, s.Full))
			continue
		}
		ups = append(ups, upload{s.Param.W, src})
	}
	var extra []string
	for _, n := range f.Names() {
		if !used[n] {
			extra = append(extra, n)
		}
	}
	sort.Strings(extra)
	if len(extra) > 5 {
		extra = append(extra[:5], fmt.Sprintf("and %d more", len(extra)-5))
	}
	if len(extra) > 0 {
		problems = append(problems, "tensors the model does not have: "+strings.Join(extra, ", "))
	}
	if len(problems) > 0 {
		return fmt.Errorf("shard: the weights in %s do not fit the parameters: %s", path, strings.Join(problems, "; "))
	}
	for _, u := range ups {
		b.Upload(u.dst, u.src)
	}
	if err := b.Err(); err != nil {
		return fmt.Errorf("shard: loading %s: %w", path, err)
	}
	return nil
}

// MergeFiles reads the files of SaveWeights written by the ranks of one
// model (any layout: each file records its slices) and merges them into
// the full parameters, by name (Merge).
func MergeFiles(paths ...string) (map[string]*tensor.Tensor, error) {
	var pieces []Piece
	for _, path := range paths {
		f, err := safetensors.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("shard: merge: %w", err)
		}
		recorded, err := fileSlices(path, f)
		if err != nil {
			return nil, err
		}
		for _, name := range f.Names() {
			t, err := f.Entries[name].Tensor()
			if err != nil {
				return nil, fmt.Errorf("shard: merge: %s: %w", path, err)
			}
			sl, ok := recorded[name]
			if !ok {
				sl = Slice{Full: t.Shape().Clone(), Dim: -1}
			}
			pieces = append(pieces, Piece{Name: name, Slice: sl, Tensor: t})
		}
	}
	return Merge(pieces)
}
