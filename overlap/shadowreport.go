package overlap

import (
	"fmt"
	"math"
	"strings"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hostreduce"
)

// ShadowReport is what one sampled step's comparisons found, over every
// rank of the world.
type ShadowReport struct {
	Step  int                // the training step
	Sites []ShadowSiteReport // in the order the sites were built
}

// ShadowSiteReport is one site's comparisons in a sampled step.
type ShadowSiteReport struct {
	Site     string       // the layer's name
	Kind     Kind         // the site's kind
	Strategy string       // the strategy compared with collective
	Slots    []ShadowSlot // the tensors compared (out, dx, dW), those the step measured
}

// ShadowSlot is the worst difference of one tensor of a site over the
// ranks and the calls of a step.
type ShadowSlot struct {
	Name string // "out", "dx", "dW" ("dweights" for the expert path)
	Diff        // the worst difference
	Rank int    // the rank where it was found
}

// Worst returns the worst slot of the report (Rel, then ULP) and its site
// (ok false when nothing was measured).
func (r ShadowReport) Worst() (site ShadowSiteReport, slot ShadowSlot, ok bool) {
	for _, s := range r.Sites {
		for _, sl := range s.Slots {
			if !ok || sl.Diff.Worse(slot.Diff) {
				site, slot, ok = s, sl, true
			}
		}
	}
	return site, slot, ok
}

// Metrics is the report as the "shadow" field of a step's metrics: per
// site and tensor, the relative difference and the ULP distance, and the
// step's worst of both.
//
//	{"rel": 1.1e-07, "ulp": 3, "sites": {"blocks.0.mlp.down": {"out": {"rel": 0, "ulp": 0}, ...}}}
func (r ShadowReport) Metrics() map[string]any {
	sites := map[string]any{}
	rel, ulp := 0.0, 0.0
	for _, s := range r.Sites {
		m := map[string]any{}
		for _, sl := range s.Slots {
			m[sl.Name] = map[string]any{"rel": jsonFloat(sl.Rel), "ulp": jsonFloat(sl.ULP)}
			rel, ulp = max(rel, sl.Rel), max(ulp, sl.ULP)
			if math.IsNaN(sl.Rel) {
				rel = math.Inf(1)
			}
		}
		sites[s.Site] = m
	}
	return map[string]any{"rel": jsonFloat(rel), "ulp": jsonFloat(ulp), "sites": sites}
}

// jsonFloat is v for JSON, which has no infinities: +Inf is written as
// the largest float64 (a difference "above everything").
func jsonFloat(v float64) float64 {
	if math.IsInf(v, 1) || math.IsNaN(v) {
		return math.MaxFloat64
	}
	return v
}

// The fields of one slot in the merge's vector.
const (
	fN = iota
	fRel
	fULP
	fIdxHi
	fIdxLo
	fGot
	fWant
	numFields
)

// EndStep ends the step begun by BeginStep. On a sampled step it merges
// every rank's comparisons over the world — a collective: every rank
// calls it after the same steps — records them in the run's summary and
// returns the "shadow" field of the step's metrics; an error when a
// difference exceeds FailAbove (the run should stop after this step: it
// names the site, the step, both values and the bound) or the merge
// fails. An unsampled step returns nothing.
func (s *Shadow) EndStep(step int) (map[string]any, error) {
	r, err := s.endStep(step)
	if err != nil || r == nil {
		return nil, err
	}
	fields := map[string]any{"shadow": r.Metrics()}
	return fields, s.Failure()
}

func (s *Shadow) endStep(step int) (*ShadowReport, error) {
	s.mu.Lock()
	sampled := s.sampled && s.step == step
	s.sampled = false
	n := len(s.sites)
	vals := make([]float64, 0, n*numSlots*numFields)
	for _, st := range s.sites {
		for _, r := range st.step {
			idx := max(r.d.Index, 0)
			vals = append(vals, float64(r.n), r.d.Rel, r.d.ULP, float64(idx>>20), float64(idx&(1<<20-1)), r.d.Got, r.d.Want)
		}
	}
	s.mu.Unlock()
	if !sampled {
		return nil, nil
	}
	P, me := 1, 0
	if s.world != nil {
		P, me = s.world.Size(), s.world.Rank()
	}
	all := make([]float64, P*len(vals))
	copy(all[me*len(vals):], vals)
	if P > 1 {
		// Every rank's vector in its row, zeros elsewhere: the sum is an
		// all-gather. First the sites' count, which must agree.
		cnt := []float64{float64(n), -float64(n)}
		if err := hostreduce.AllReduce(s.b, s.world, s.dt, cnt, comm.Max, s.st); err != nil {
			return nil, fmt.Errorf("shadow: step %d: %w", step, err)
		}
		if int(cnt[0]) != n || int(-cnt[1]) != n {
			return nil, fmt.Errorf("shadow: step %d: rank %d shadows %d sites, the world's ranks between %d and %d: expected the same sites on every rank", step, me, n, int(-cnt[1]), int(cnt[0]))
		}
		for i, v := range all { // the merge's sum needs finite values
			if math.IsInf(v, 1) || math.IsNaN(v) {
				all[i] = math.MaxFloat32
			}
		}
		if err := hostreduce.AllReduce(s.b, s.world, s.dt, all, comm.Sum, s.st); err != nil {
			return nil, fmt.Errorf("shadow: step %d: merging the ranks' comparisons: %w", step, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := &ShadowReport{Step: step}
	L := len(vals)
	for i, st := range s.sites {
		sr := ShadowSiteReport{Site: st.name, Kind: st.kind, Strategy: st.strategy}
		for slot := range numSlots {
			var best ShadowSlot
			found := false
			for r := range P {
				f := all[r*L+(i*numSlots+slot)*numFields:]
				if f[fN] == 0 {
					continue
				}
				d := Diff{Rel: finiteOrInf(f[fRel]), ULP: finiteOrInf(f[fULP]), Index: int(f[fIdxHi])<<20 + int(f[fIdxLo]), Got: f[fGot], Want: f[fWant]}
				if !found || d.Worse(best.Diff) {
					best, found = ShadowSlot{Name: SlotName(st.kind, slot), Diff: d, Rank: r}, true
				}
			}
			if found {
				sr.Slots = append(sr.Slots, best)
			}
		}
		if len(sr.Slots) > 0 {
			s.worst[i].add(step, sr)
		}
		rep.Sites = append(rep.Sites, sr)
	}
	s.steps++
	if s.failure == nil && s.cfg.FailAbove != nil {
		if site, slot, ok := rep.Worst(); ok && !(slot.Rel <= *s.cfg.FailAbove) {
			s.failure = fmt.Errorf("shadow: step %d: site %s (%s, %s): %s differs from collective's by %s relative, above fail_above %g: at element %d on rank %d, %s %v and collective %v (%s ULP)",
				step, site.Site, site.Kind, site.Strategy, slot.Name, fmtRel(slot.Rel), *s.cfg.FailAbove, slot.Index, slot.Rank,
				site.Strategy, slot.Got, slot.Want, fmtULP(slot.ULP))
		}
	}
	return rep, nil
}

// finiteOrInf undoes the merge's stand-in for +Inf.
func finiteOrInf(v float64) float64 {
	if v >= math.MaxFloat32 {
		return math.Inf(1)
	}
	return v
}

func fmtRel(v float64) string {
	if math.IsInf(v, 1) {
		return "Inf"
	}
	return fmt.Sprintf("%.3g", v)
}

func fmtULP(v float64) string {
	if math.IsInf(v, 1) {
		return "Inf"
	}
	return fmt.Sprintf("%.0f", v)
}

// siteWorst is a site's worst comparisons over the run.
type siteWorst struct {
	steps         int
	rel, ulp      ShadowSlot
	relAt, ulpAt  int // their steps
	hasRel, hasUL bool
}

func (w *siteWorst) add(step int, sr ShadowSiteReport) {
	w.steps++
	for _, sl := range sr.Slots {
		if !w.hasRel || sl.Diff.Worse(w.rel.Diff) {
			w.rel, w.relAt, w.hasRel = sl, step, true
		}
		if !w.hasUL || sl.ULP > w.ulp.ULP {
			w.ulp, w.ulpAt, w.hasUL = sl, step, true
		}
	}
}

// Summary is the table of the run's shadow comparisons, one line per
// shadowed site after a header: the steps sampled, the worst relative
// difference and where (tensor, step, rank), the worst ULP distance. A
// site above fail_above (or, without it, above its dtype's tolerance) is
// flagged "<-".
func (s *Shadow) Summary() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	bound, what := s.model.Tolerance(), fmt.Sprintf("the %s tolerance", s.model)
	if s.cfg.FailAbove != nil {
		bound, what = *s.cfg.FailAbove, "fail_above"
	}
	width := len("site")
	for _, st := range s.sites {
		width = max(width, len(st.name))
	}
	out := []string{fmt.Sprintf("shadow: every %d steps, %d sampled; each site's strategy against collective (relative difference, ULPs of %s; <- above %s %g)",
		s.cfg.Every, s.steps, s.model, what, bound),
		fmt.Sprintf("  %-*s  %-21s  %-9s  %5s  %-9s  %-20s  %s", width, "site", "kind", "strategy", "steps", "worst rel", "where", "worst ULP")}
	flagged := 0
	for i, st := range s.sites {
		w := s.worst[i]
		rel, where, ulp := "-", "-", "-"
		switch {
		case w.hasRel && w.rel.Rel == 0 && w.ulp.ULP == 0:
			rel, ulp = "0", "0" // collective's bits at every sampled step
		case w.hasRel:
			rel = fmtRel(w.rel.Rel)
			where = fmt.Sprintf("%s, step %d, rank %d", w.rel.Name, w.relAt, w.rel.Rank)
			ulp = fmt.Sprintf("%s (%s, step %d)", fmtULP(w.ulp.ULP), w.ulp.Name, w.ulpAt)
		}
		line := fmt.Sprintf("  %-*s  %-21s  %-9s  %5d  %-9s  %-20s  %s", width, st.name, st.kind, st.strategy, w.steps, rel, where, ulp)
		if w.hasRel && !(w.rel.Rel <= bound) {
			line += "  <-"
			flagged++
		}
		out = append(out, strings.TrimRight(line, " "))
	}
	if flagged > 0 {
		out = append(out, fmt.Sprintf("shadow: %d of %d sites above %s %g", flagged, len(s.sites), what, bound))
	}
	return out
}
