package ablate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Entry is one autotune choice: for a site of Kind whose spec has K and
// outputs summing to Outs, at M tokens (global rows), on World ranks over
// Transport on GPU ("cpu" on the CPU) in DType, the fastest strategy whose
// every direction was verified, as the chooser names it.
type Entry struct {
	Kind      overlap.Kind `json:"kind"`
	M         int          `json:"m"`
	K         int          `json:"spec_k"`
	Outs      int          `json:"spec_outs"`
	World     int          `json:"world"`
	Transport string       `json:"transport"`
	GPU       string       `json:"gpu"`
	DType     string       `json:"dtype"`
	Strategy  string       `json:"strategy"`
	// TimesUS are the candidates' times (forward + backward), for the reader.
	TimesUS map[string]float64 `json:"times_us"`
	Shape   string             `json:"shape"` // the cell's shape, for the reader
}

func (e Entry) key() string {
	return fmt.Sprintf("%s|%d|%d|%d|%d|%s|%s|%s", e.Kind, e.M, e.K, e.Outs, e.World, e.Transport, e.GPU, e.DType)
}

// Cache is an autotune cache: cmd/ablate writes it from its results,
// cmd/train --overlap auto reads it.
type Cache struct {
	Entries []Entry `json:"entries"`
}

// chooserName is the name under which the chooser builds the matrix's
// strategy s: the same (one name, one type), "" for a name it has not.
func chooserName(s, transport string) string {
	switch s {
	case Collective, Pipelined, Fused:
		return s
	}
	return ""
}

// kindOf is the site kind of an op, "" for ops without a site.
func kindOf(op Op) overlap.Kind {
	switch op {
	case OpAllGatherMatmul:
		return overlap.KindAllGatherMatmul
	case OpMatmulReduceScatter:
		return overlap.KindMatmulReduceScatter
	case OpMatmulAllReduce:
		return overlap.KindMatmulAllReduce
	}
	return ""
}

// FromResults makes the cache of a run's results on gpu ("cpu" for local
// and tcp): per site (op, shape, world, transport, dtype) the strategy
// with the least forward + backward time among those whose every direction
// is verified and timed.
func FromResults(rs []Result, gpu string) Cache {
	type acc struct {
		e     Entry
		dirs  map[string]map[string]bool // strategy → dirs ok
		wrong map[string]bool
	}
	accs := map[string]*acc{}
	var order []string
	for _, r := range rs {
		kind := kindOf(r.Op)
		name := chooserName(r.Strategy, r.Transport)
		if kind == "" || name == "" {
			continue
		}
		g := gpu
		if r.Transport == "local" || r.Transport == "tcp" {
			g = "cpu"
		}
		e := Entry{Kind: kind, M: r.Shape.M, K: r.SpecK, Outs: r.SpecOuts, World: r.World, Transport: r.Transport, GPU: g,
			DType: DTypeOf(r.DType).String(), TimesUS: map[string]float64{}, Shape: r.Shape.String()}
		a := accs[e.key()]
		if a == nil {
			a = &acc{e: e, dirs: map[string]map[string]bool{}, wrong: map[string]bool{}}
			accs[e.key()] = a
			order = append(order, e.key())
		}
		if !r.Timed() {
			a.wrong[name] = true
			continue
		}
		if a.dirs[name] == nil {
			a.dirs[name] = map[string]bool{}
		}
		a.dirs[name][r.Dir] = true
		a.e.TimesUS[name] += r.MedianUS
	}
	var c Cache
	for _, k := range order {
		a := accs[k]
		best, bestT := "", math.Inf(1)
		names := make([]string, 0, len(a.e.TimesUS))
		for n := range a.e.TimesUS {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if a.wrong[n] || len(a.dirs[n]) != len(kindDirs(a.e.Kind)) {
				delete(a.e.TimesUS, n)
				continue
			}
			if t := a.e.TimesUS[n]; t < bestT {
				best, bestT = n, t
			}
		}
		if best == "" {
			continue
		}
		a.e.Strategy = best
		c.Entries = append(c.Entries, a.e)
	}
	return c
}

func kindDirs(k overlap.Kind) []string {
	for _, op := range Ops {
		if kindOf(op) == k {
			return op.Dirs()
		}
	}
	return nil
}

// Merge adds o's entries, replacing those of the same key.
func (c *Cache) Merge(o Cache) {
	idx := map[string]int{}
	for i, e := range c.Entries {
		idx[e.key()] = i
	}
	for _, e := range o.Entries {
		if i, ok := idx[e.key()]; ok {
			c.Entries[i] = e
		} else {
			idx[e.key()] = len(c.Entries)
			c.Entries = append(c.Entries, e)
		}
	}
}

// LoadCache reads a cache file; a file that does not exist is an empty
// cache (and exists false).
func LoadCache(path string) (c Cache, exists bool, err error) {
	js, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Cache{}, false, nil
	}
	if err != nil {
		return Cache{}, false, fmt.Errorf("autotune cache: %w", err)
	}
	if err := json.Unmarshal(js, &c); err != nil {
		return Cache{}, true, fmt.Errorf("autotune cache %s: expected the JSON of cmd/ablate's autotune.json: %v", path, err)
	}
	for i, e := range c.Entries {
		if e.Kind == "" || e.Strategy == "" || e.World < 1 || e.M < 1 {
			return Cache{}, true, fmt.Errorf("autotune cache %s: entry %d %+v: expected a kind, a strategy, a world ≥ 1 and M ≥ 1", path, i, e)
		}
	}
	return c, true, nil
}

// Save writes the cache (creating the folder) atomically: a temporary file
// in the same folder, renamed over the old one.
func (c Cache) Save(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(append(js, '\n'))
	if e := f.Close(); err == nil {
		err = e
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// MergeSave merges c into the cache file at path (what the file holds now,
// c's entries replacing those of the same key) and saves it atomically.
func MergeSave(path string, c Cache) error {
	old, _, err := LoadCache(path)
	if err != nil {
		return err
	}
	old.Merge(c)
	return old.Save(path)
}

// Lookup is the cache as one run's chooser consults it (overlap.Tuning):
// the run's transport, GPU ("cpu") and tokens (the global rows of a step,
// used for a spec that does not give its rows).
type Lookup struct {
	Cache     Cache
	Path      string
	Transport string
	GPU       string
	Tokens    int
	DType     string // the run's dtype ("f32", "bf16"), for a spec that does not give its own
}

var _ overlap.Tuning = Lookup{}

// Tuned picks, among the entries of the site's kind, spec widths, world,
// transport, GPU and dtype, the one whose M is nearest the site's (in
// ratio); without an M (no rows in the spec and no tokens), the largest.
func (l Lookup) Tuned(sp overlap.Spec) (string, string, bool) {
	if sp.Group == nil {
		return "", "", false
	}
	P := sp.Group.Size()
	m, outs, dt := siteKey(sp, l.Tokens, l.DType)
	var best *Entry
	bestD := math.Inf(1)
	for i := range l.Cache.Entries {
		e := &l.Cache.Entries[i]
		if e.Kind != sp.Kind || e.K != sp.K || e.Outs != outs || e.World != P || e.Transport != l.Transport || e.GPU != l.GPU || e.DType != dt {
			continue
		}
		d := -float64(e.M) // no M: the largest
		if m > 0 {
			d = math.Abs(math.Log(float64(e.M) / float64(m)))
		}
		if d < bestD {
			best, bestD = e, d
		}
	}
	if best == nil {
		return "", "", false
	}
	how := "exact M"
	switch {
	case m == 0:
		how = "the largest M (this site's M is unknown)"
	case best.M != m:
		how = fmt.Sprintf("nearest M %d to %d", best.M, m)
	}
	return best.Strategy, fmt.Sprintf("autotune cache %s (%s, world %d, %s, %s; %s)", l.Path, sp.Kind, P, l.Transport, l.GPU, how), true
}

// siteKey is what a site's spec gives the cache key: its global rows M
// (the spec's rows, times P for an all-gather's shard; else the run's
// tokens), the sum of its output widths, and its dtype (else the run's).
func siteKey(sp overlap.Spec, tokens int, runDType string) (m, outs int, dt string) {
	for _, o := range sp.Outs {
		outs += o
	}
	m = sp.Rows
	if sp.Kind == overlap.KindAllGatherMatmul {
		m *= sp.Group.Size()
	}
	if m == 0 {
		m = tokens
	}
	dt = runDType
	if sp.DType != tensor.Invalid {
		dt = sp.DType.String()
	}
	return m, outs, dt
}
