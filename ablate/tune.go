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
	"strings"

	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// Entry is one autotune choice: for a site of Kind whose spec has K and
// outputs summing to Outs, at M tokens (global rows), on World ranks over
// Transport on GPU ("cpu" on the CPU) in DType, the strategy to use. A
// strategy other than collective is chosen only when it is faster than
// collective beyond the noise (Stats: its interval, forward + backward
// round by round, lies below 1/(1 + the minimum effect)); otherwise the
// entry says no significant difference and chooses collective.
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
	// Significant says whether the choice rests on a significant
	// difference: the chosen strategy is faster than collective (and than
	// every other such one, or the first of them in the matrix's order
	// where they do not differ), or collective is faster than every other
	// candidate. A choice that is not significant is collective.
	Significant bool `json:"significant"`
	// Basis says why, in words.
	Basis string `json:"basis,omitempty"`
	// VsCollective compares each other candidate with collective
	// (forward + backward, round by round).
	VsCollective map[string]Interval `json:"vs_collective,omitempty"`
	// TimesUS are the candidates' median times (forward + backward), for
	// the reader.
	TimesUS map[string]float64 `json:"times_us"`
	Shape   string             `json:"shape"` // the cell's shape, for the reader
}

func (e Entry) key() string {
	return fmt.Sprintf("%s|%d|%d|%d|%d|%s|%s|%s", e.Kind, e.M, e.K, e.Outs, e.World, e.Transport, e.GPU, e.DType)
}

// CacheVersion is the format of the cache files this package writes and
// reads: 2 has the significance of each choice (Entry.Significant). An
// older file chose the fastest median however small the difference, so
// its choices may rest on noise: LoadCache refuses it, saying to re-run
// the ablation.
const CacheVersion = 2

// Cache is an autotune cache: cmd/ablate writes it from its results,
// cmd/train --overlap auto reads it.
type Cache struct {
	Version int     `json:"version"`
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

// siteRounds are the results of one cache key: per strategy, per
// direction, the timed rounds; the strategies wrong or untimed in a
// direction; the directions seen.
type siteRounds struct {
	e      Entry
	rounds map[string]map[string][]float64
	bad    map[string]bool
	dirs   map[string]bool
}

// sites groups the results of world ≥ 2 by cache key, in order. A group of
// one rank is no key: it has nothing to exchange (Lookup answers
// collective for it), so its cells measure only the strategies' machinery.
func sites(rs []Result, gpu string) []*siteRounds {
	accs := map[string]*siteRounds{}
	var order []*siteRounds
	for _, r := range rs {
		kind := kindOf(r.Op)
		name := chooserName(r.Strategy, r.Transport)
		if kind == "" || name == "" || r.World < 2 {
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
			a = &siteRounds{e: e, rounds: map[string]map[string][]float64{}, bad: map[string]bool{}, dirs: map[string]bool{}}
			accs[e.key()] = a
			order = append(order, a)
		}
		if r.Status == StatusNotRun && r.Strategy != Collective {
			continue // a strategy that cannot run here is no candidate
		}
		a.dirs[r.Dir] = true
		if !r.Timed() || len(r.TimesUS) == 0 {
			a.bad[name] = true
			continue
		}
		if a.rounds[name] == nil {
			a.rounds[name] = map[string][]float64{}
		}
		a.rounds[name][r.Dir] = r.TimesUS
	}
	return order
}

// candidates are the strategies of the key timed in every direction and
// wrong in none, in the matrix's order, collective first, and their
// per-round forward + backward sums; ok is false when collective is not
// among them.
func (a *siteRounds) candidates() (names []string, sums map[string][]float64, ok bool) {
	var dirs []string
	for d := range a.dirs {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	sums = map[string][]float64{}
	for _, n := range Strategies {
		if a.bad[n] || len(a.rounds[n]) != len(dirs) {
			continue
		}
		var series [][]float64
		for _, d := range dirs {
			series = append(series, a.rounds[n][d])
		}
		if s := sumRounds(series...); s != nil {
			names = append(names, n)
			sums[n] = s
		}
	}
	return names, sums, len(names) > 0 && names[0] == Collective
}

// pick is the choice among candidates (collective first) whose rounds are
// sums, at st's level: the entry's Strategy, Significant, Basis and
// VsCollective.
func pick(names []string, sums map[string][]float64, st Stats) (strategy string, significant bool, basis string, vs map[string]Interval) {
	vs = map[string]Interval{}
	var faster []string
	slower := 0
	for _, n := range names[1:] {
		iv := st.compare(sums[n], sums[Collective])
		vs[n] = iv
		switch iv.Verdict {
		case Faster:
			faster = append(faster, n)
		case Slower:
			slower++
		}
	}
	switch {
	case len(names) == 1:
		return Collective, false, "no other strategy was verified and timed here, so collective", vs
	case len(faster) == 0 && slower == len(names)-1:
		return Collective, true, "every other strategy is slower than collective beyond the noise", vs
	case len(faster) == 0:
		var parts []string
		for _, n := range names[1:] {
			parts = append(parts, fmt.Sprintf("%s %s", n, vs[n].SpeedupText()))
		}
		return Collective, false, "no significant difference (" + strings.Join(parts, ", ") + "), so collective", vs
	}
	best := faster[0]
	for _, n := range faster[1:] {
		if st.compare(sums[n], sums[best]).Verdict == Faster {
			best = n
		}
	}
	return best, true, fmt.Sprintf("%s is faster than collective beyond the noise: %s", best, vs[best].SpeedupText()), vs
}

// entryComparisons is the number of comparisons pick makes among k
// candidates besides collective: each against collective, and each pair
// of them.
func entryComparisons(k int) int { return k + k*(k-1)/2 }

// FromResults makes the cache of a run's results on gpu ("cpu" for local
// and tcp): per site (op, shape, world ≥ 2, transport, dtype) the choice
// among the strategies verified and timed in every direction, by pick, at
// st's level (st.For of the run).
func FromResults(rs []Result, gpu string, st Stats) Cache {
	c := Cache{Version: CacheVersion}
	for _, a := range sites(rs, gpu) {
		names, sums, ok := a.candidates()
		if !ok {
			continue
		}
		e := a.e
		for _, n := range names {
			e.TimesUS[n] = math.Round(median(sums[n])*10) / 10
		}
		e.Strategy, e.Significant, e.Basis, e.VsCollective = pick(names, sums, st)
		c.Entries = append(c.Entries, e)
	}
	return c
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
	switch {
	case c.Version < CacheVersion:
		return Cache{}, true, fmt.Errorf("autotune cache %s: format version %d, expected %d: it was written before each choice was tested against the noise, "+
			"so its choices may rest on differences smaller than the noise; remove it and re-run the ablation (go run ./cmd/ablate) or cmd/train --autotune "+
			"to write it again", path, c.Version, CacheVersion)
	case c.Version > CacheVersion:
		return Cache{}, true, fmt.Errorf("autotune cache %s: format version %d, expected %d: it was written by a newer asynctp", path, c.Version, CacheVersion)
	}
	for i, e := range c.Entries {
		if e.Kind == "" || e.Strategy == "" || e.World < 1 || e.M < 1 {
			return Cache{}, true, fmt.Errorf("autotune cache %s: entry %d %+v: expected a kind, a strategy, a world ≥ 1 and M ≥ 1", path, i, e)
		}
	}
	return c, true, nil
}

// Save writes the cache (creating the folder) atomically: a temporary file
// in the same folder, renamed over the old one. It is written in the
// current format (CacheVersion).
func (c Cache) Save(path string) error {
	c.Version = CacheVersion
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

// worldOne is the answer for a site whose group is one rank: nothing to
// exchange, so collective (the ablation's world-1 cells measure only what
// the other strategies' machinery costs).
const worldOne = "a group of 1 rank has nothing to exchange, so collective"

// Tuned picks, among the entries of the site's kind, spec widths, world,
// transport, GPU and dtype, the one whose M is nearest the site's (in
// ratio); without an M (no rows in the spec and no tokens), the largest.
// A site whose group is one rank gets collective.
func (l Lookup) Tuned(sp overlap.Spec) (string, string, bool) {
	if sp.Group == nil {
		return "", "", false
	}
	P := sp.Group.Size()
	if P == 1 {
		return Collective, worldOne, true
	}
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
	return best.Strategy, fmt.Sprintf("autotune cache %s (%s, world %d, %s, %s; %s: %s)", l.Path, sp.Kind, P, l.Transport, l.GPU, how, best.basis()), true
}

// basis is why the entry chose its strategy.
func (e Entry) basis() string {
	if e.Basis != "" {
		return e.Basis
	}
	if e.Significant {
		return e.Strategy + ", a significant choice"
	}
	return e.Strategy + ", not a significant choice"
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
