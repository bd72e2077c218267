package ablate

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/overlap"
)

// AutoTune is the chooser's Tuning of a run with --autotune: a site the
// cache has an entry for at the site's M is given that entry's strategy;
// any other site of a kind with a cell (all-gather-matmul,
// matmul-reduce-scatter, matmul-all-reduce) is tuned on the spot: a short
// verified micro-run on the site's group — collective first, checked
// against the math; pipelined (and fused, where the run has it) checked
// against collective; timed together in Warmup discarded and Reps timed
// interleaved rounds, forward and backward — and the choice is
// FromResults': another strategy only where it is faster than collective
// beyond the noise (Stats with Alpha and MinEffect, its family the site's
// comparisons), else collective. A candidate that refuses the site (its
// Supports) or is wrong in a direction is left out of the choice, not an
// error. A site whose group is one rank gets collective, untimed (nothing
// to exchange). The rounds are agreed over World (per call the maximum of
// every rank's), so every rank of the run takes the same decision; each
// rank has its own AutoTune, and
// every rank builds the same sites in the same order (the micro-runs are
// collective over the site's group and the agreement over World).
// Measured holds what was tuned, for the cache file.
type AutoTune struct {
	Lookup
	// World is every rank of the run (nil: the site's group decides).
	World comm.Comm
	// Pipelined is the pipelined strategy of this run (the chooser's).
	Pipelined overlap.Strategy
	// Fused, when not nil, is the fused strategy of this run (the
	// chooser's "fused", strategies.Fused on NVSHMEM GPUs): a candidate of
	// every site it supports.
	Fused        overlap.Strategy
	Seed         uint64
	Warmup, Reps int
	// Alpha and MinEffect are the micro-runs' Stats (0: DefaultAlpha, and
	// DefaultMinEffectCPU or DefaultMinEffectGPU by the run's GPU).
	Alpha, MinEffect float64

	mu       sync.Mutex
	measured Cache
	err      error
}

var _ overlap.Tuning = (*AutoTune)(nil)

// Measured is what this run tuned.
func (a *AutoTune) Measured() Cache {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Cache{Entries: append([]Entry(nil), a.measured.Entries...)}
}

// Err is the first error of a micro-run (the ranks could not go on
// together), or nil.
func (a *AutoTune) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// opOfKind is the op of the matrix that times a site kind.
func opOfKind(k overlap.Kind) Op {
	for _, op := range Ops {
		if kindOf(op) == k {
			return op
		}
	}
	return ""
}

// Tuned implements overlap.Tuning.
func (a *AutoTune) Tuned(sp overlap.Spec) (string, string, bool) {
	if sp.Group == nil {
		return "", "", false
	}
	if sp.Group.Size() == 1 {
		return Collective, worldOne, true
	}
	key, m := a.entryFor(sp)
	if e, ok := a.exact(key); ok {
		return e.Strategy, fmt.Sprintf("autotune cache %s (%s, world %d, %s, %s; exact M)", a.Path, sp.Kind, key.World, a.Transport, a.GPU), true
	}
	a.mu.Lock()
	for _, e := range a.measured.Entries {
		if e.key() == key.key() {
			a.mu.Unlock()
			return e.Strategy, fmt.Sprintf("autotuned at start (%s, world %d, %s, %s, M %d), written to %s", sp.Kind, key.World, a.Transport, a.GPU, m, a.Path), true
		}
	}
	a.mu.Unlock()
	op := opOfKind(sp.Kind)
	if op == "" || m < 1 || a.Pipelined == nil {
		return a.Lookup.Tuned(sp)
	}
	e, err := a.tune(sp, op, key, m)
	if err != nil {
		a.mu.Lock()
		if a.err == nil {
			a.err = fmt.Errorf("autotune of %s site %q: %w", sp.Kind, sp.Name, err)
		}
		a.mu.Unlock()
		return Collective, fmt.Sprintf("autotune failed (%v), so collective", err), true
	}
	a.mu.Lock()
	a.measured.Merge(Cache{Entries: []Entry{e}})
	a.mu.Unlock()
	names := make([]string, 0, len(e.TimesUS))
	for n := range e.TimesUS {
		names = append(names, n)
	}
	sort.Strings(names)
	var ts []string
	for _, n := range names {
		ts = append(ts, fmt.Sprintf("%s %.0f µs", n, e.TimesUS[n]))
	}
	return e.Strategy, fmt.Sprintf("autotuned at start (%s, world %d, %s, %s, M %d: %s; %s), written to %s",
		sp.Kind, key.World, a.Transport, a.GPU, m, strings.Join(ts, ", "), e.basis(), a.Path), true
}

// stats are the micro-runs' significance settings.
func (a *AutoTune) stats() Stats {
	st := Stats{Alpha: a.Alpha, MinEffect: a.MinEffect}
	if st.Alpha == 0 {
		st.Alpha = DefaultAlpha
	}
	if st.MinEffect == 0 {
		st.MinEffect = DefaultMinEffectGPU
		if a.GPU == "cpu" || a.GPU == "" || a.Transport == "local" || a.Transport == "tcp" {
			st.MinEffect = DefaultMinEffectCPU
		}
	}
	return st
}

// exact is the cache's entry of key, if any.
func (a *AutoTune) exact(key Entry) (Entry, bool) {
	for _, e := range a.Cache.Entries {
		if e.key() == key.key() {
			return e, true
		}
	}
	return Entry{}, false
}

// entryFor is the cache key of the site (Strategy and times empty) and its
// M (global rows: the site's rows, else the run's tokens).
func (a *AutoTune) entryFor(sp overlap.Spec) (Entry, int) {
	P := sp.Group.Size()
	m, outs, dt := siteKey(sp, a.Tokens, a.DType)
	gpu := a.GPU
	if a.Transport == "local" || a.Transport == "tcp" {
		gpu = "cpu"
	}
	return Entry{Kind: sp.Kind, M: m, K: sp.K, Outs: outs, World: P, Transport: a.Transport, GPU: gpu, DType: dt}, m
}

// tune runs the micro-run of the site and returns its entry.
func (a *AutoTune) tune(sp overlap.Spec, op Op, key Entry, m int) (Entry, error) {
	P := key.World
	sh := Shape{Name: "autotune", M: m}
	switch op {
	case OpAllGatherMatmul: // per rank: (M/P, K) rows, outputs of width outs
		sh.N, sh.K = key.Outs*P, key.K
	default: // per rank: (M, K) inner slice of a global K·P
		sh.N, sh.K = key.Outs, key.K*P
	}
	pipe := Pipelined
	strats := map[string]overlap.Strategy{Collective: overlap.Collective{}, pipe: a.Pipelined}
	names := []string{Collective, pipe}
	// Fused where it supports the site itself (the micro-run's own spec
	// is checked again by Rank.Run, which reports a refusal as not run).
	if a.Fused != nil && a.Fused.Supports(sp) == nil {
		strats[Fused] = a.Fused
		names = append(names, Fused)
	}
	var cells []Cell
	for _, d := range sh.DirsOf(op) {
		for _, s := range names {
			cells = append(cells, Cell{Op: op, Dir: d, Shape: sh, World: P, Transport: a.Transport, Strategy: s, DType: key.DType})
		}
	}
	for _, c := range cells {
		if why := Runnable(c, P, ""); why != "" { // the run has its GPUs: only the shape decides
			return Entry{}, fmt.Errorf("%s: %s", c.ID(), why)
		}
	}
	r := &Rank{Group: sp.Group, Backend: sp.Backend, Stream: sp.Stream, Timer: WallTimer{Backend: sp.Backend},
		Strategies: strats, Seed: a.Seed, Warmup: a.Warmup, Reps: max(1, a.Reps)}
	rs, err := r.Run(cells)
	if err != nil {
		return Entry{}, err
	}
	if len(rs) != len(cells) {
		return Entry{}, fmt.Errorf("%d results of %d cells", len(rs), len(cells))
	}
	// Agree over the world: per cell and round the slowest rank's time,
	// and a cell any rank could not time is untimed everywhere.
	if a.World != nil && a.World.Size() > P {
		R := max(1, a.Reps)
		vs := make([]float64, len(rs)*R)
		for i, x := range rs {
			for j := range R {
				vs[i*R+j] = failedErr
				if x.Timed() && j < len(x.TimesUS) {
					vs[i*R+j] = x.TimesUS[j]
				}
			}
		}
		w := &Rank{Group: a.World, Backend: sp.Backend, Stream: sp.Stream}
		if vs, err = w.maxEach(vs); err != nil {
			return Entry{}, err
		}
		for i := range rs {
			ts := vs[i*R : (i+1)*R]
			if slices.Max(ts) >= failedErr {
				if rs[i].Status == StatusOK {
					rs[i].Status, rs[i].Reason = StatusWrong, "not timed on another rank of the world"
				}
				continue
			}
			rs[i].setTimes(ts)
		}
	}
	c := FromResults(rs, a.GPU, a.stats().For(rs))
	if len(c.Entries) != 1 {
		var why []string
		for _, x := range rs {
			if !x.Timed() {
				why = append(why, fmt.Sprintf("%s: %s %s", x.ID(), x.Status, x.Reason))
			}
		}
		return Entry{}, fmt.Errorf("no strategy verified in every direction (%s)", strings.Join(why, "; "))
	}
	e := c.Entries[0]
	if e.key() != key.key() {
		return Entry{}, fmt.Errorf("the micro-run's entry %s is not the site's %s", e.key(), key.key())
	}
	for n, t := range e.TimesUS {
		e.TimesUS[n] = math.Round(t*10) / 10
	}
	e.Shape = fmt.Sprintf("site %q", sp.Name)
	return e, nil
}
