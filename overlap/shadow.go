package overlap

import (
	"errors"
	"fmt"
	"math"
	"path"
	"strings"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/layerkit"
	"github.com/asynctp/asynctp/tensor"
)

// ShadowConfig is shadow mode: the JSON "shadow" section of a run's
// configuration and the --shadow-every flag.
//
//	{"every": 100, "sites": ["matmul-reduce-scatter", "blocks.0.*"], "fail_above": 1e-5}
//
// On every Every-th step each shadowed site — a site whose strategy is not
// collective, matching one of Sites (a site kind or a pattern of layer
// names, as the keys of Config.Sites; none: every such site) — also runs
// its op on the collective strategy, from the same inputs, into buffers of
// its own, and the two are compared (Diff): the site's outputs in the
// forward, its input gradient and weight gradients in the backward. The
// training step's results are the strategy's, untouched.
type ShadowConfig struct {
	// Every samples the steps whose number is a multiple of Every (0:
	// DefaultShadowEvery).
	Every int `json:"every,omitempty"`
	// Sites restricts the shadow to the sites matching one of them.
	Sites []string `json:"sites,omitempty"`
	// FailAbove, when set, stops the run after a sampled step where a
	// site's relative difference (Diff.Rel) exceeds it; nil: the run goes
	// on and the summary flags the sites above their dtype's tolerance.
	FailAbove *float64 `json:"fail_above,omitempty"`
}

// Validate checks the values and patterns, without building anything.
func (c ShadowConfig) Validate() error {
	if c.Every < 0 {
		return fmt.Errorf("shadow: every %d: expected a number of steps ≥ 1 (0: the default, %d)", c.Every, DefaultShadowEvery)
	}
	for _, p := range c.Sites {
		if p == "" {
			return fmt.Errorf("shadow: sites %q: expected a site kind (%s) or a pattern of layer names, not an empty one", c.Sites, kindList())
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("shadow: site pattern %q: %v", p, err)
		}
	}
	if f := c.FailAbove; f != nil && !(*f >= 0 && !math.IsInf(*f, 1)) {
		return fmt.Errorf("shadow: fail_above %v: expected a relative difference ≥ 0", *f)
	}
	return nil
}

// DefaultShadowEvery is the sampling period of a shadow configured without
// one: on the CPU at TP 2 with sequence parallelism a sampled step costs
// 1.6–2.4 times a step (every site runs twice, and the comparisons read
// both results), so sampling one step in 100 adds about 1 % to the average
// step time (BENCHMARKS.md, "Shadow mode"), well under the 5 % the check
// may cost.
const DefaultShadowEvery = 100

// The tensors a site's shadow compares, by kind: the outputs of the
// forward (out: the matmuls' outputs, the gathered input of
// all-gather∘matmul; the expert path's dispatched rows and combined
// output), the input gradients of the backward (dx: the expert path's
// returned expert-row gradients and token gradients) and the gradients of
// the site's weights (dW, accumulated from the same start by both; the
// expert path's gradient of the routing weights, dweights).
// matmul∘all-reduce has out only: its one call serves the forward of a
// row-parallel exit and the backward of a column-parallel entry.
const (
	SlotOut = iota
	SlotDX
	SlotDW
	numSlots
)

// SlotName is the name of slot in reports, for a site of kind k.
func SlotName(k Kind, slot int) string {
	switch slot {
	case SlotOut:
		return "out"
	case SlotDX:
		return "dx"
	case SlotDW:
		if k == KindExpert {
			return "dweights"
		}
		return "dW"
	}
	return fmt.Sprintf("slot %d", slot)
}

// Shadow is one rank's shadow mode: the sites it shadows, which step is
// sampled, and what the comparisons found. The training loop brackets
// each step with BeginStep and EndStep (train.StepWatcher); a Chooser with
// WithShadow wraps the sites it builds. Every rank has its own Shadow,
// and every rank of the world samples the same steps and calls EndStep,
// which merges the ranks' comparisons (a collective over the world).
type Shadow struct {
	cfg   ShadowConfig
	world comm.Comm
	b     tensor.Backend
	st    comm.Stream
	dt    tensor.DType // the dtype of the merge's buffer
	model tensor.DType // the model's dtype

	mu      sync.Mutex
	sites   []*shadowState
	unused  map[string]bool // patterns of cfg.Sites that matched no shadowed site
	skipped map[string]int  // collective sites a pattern matched: "pattern" → count
	step    int
	sampled bool
	worst   []siteWorst // per site, over the run
	steps   int         // sampled steps ended
	failure error       // the first step over FailAbove
}

type shadowState struct {
	name     string
	kind     Kind
	strategy string
	step     [numSlots]slotRecord // this rank's, the current step
}

type slotRecord struct {
	n int
	d Diff
}

// NewShadow makes a rank's Shadow of cfg. EndStep merges the ranks'
// comparisons over world (nil: this rank alone) through b's memory, on
// stream st (nil on the CPU); dt is the model's dtype (a float64 model
// merges in float64, any other in float32).
func NewShadow(cfg ShadowConfig, world comm.Comm, b tensor.Backend, st comm.Stream, dt tensor.DType) (*Shadow, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Every == 0 {
		cfg.Every = DefaultShadowEvery
	}
	if world != nil && b == nil {
		return nil, errors.New("shadow: a world without a backend: expected the backend the ranks' comparisons are merged through")
	}
	s := &Shadow{cfg: cfg, world: world, b: b, st: st, dt: layerkit.StatDType(dt), model: dt, unused: map[string]bool{}, skipped: map[string]int{}}
	for _, p := range cfg.Sites {
		s.unused[p] = true
	}
	return s, nil
}

// Config returns the shadow's configuration.
func (s *Shadow) Config() ShadowConfig { return s.cfg }

// matches reports whether the site of sp is one cfg.Sites selects (all
// when empty), marking the patterns that matched.
func (s *Shadow) matches(sp Spec, strategy string) bool {
	if len(s.cfg.Sites) == 0 {
		return true
	}
	hit := false
	for _, p := range s.cfg.Sites {
		ok := p == string(sp.Kind)
		if !ok && sp.Name != "" {
			ok, _ = path.Match(p, sp.Name)
		}
		if !ok {
			continue
		}
		hit = true
		if strategy == (Collective{}).Name() {
			s.skipped[p]++
		} else {
			delete(s.unused, p)
		}
	}
	return hit
}

// site registers the site of sp, built by strategy, and returns its
// handle, or nil when the shadow leaves it alone: the site runs
// collective (the reference itself), or cfg.Sites does not select it.
func (s *Shadow) site(sp Spec, strategy string) *ShadowSite {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.matches(sp, strategy) || strategy == (Collective{}).Name() {
		return nil
	}
	s.sites = append(s.sites, &shadowState{name: sp.Name, kind: sp.Kind, strategy: strategy})
	s.worst = append(s.worst, siteWorst{})
	return &ShadowSite{sh: s, i: len(s.sites) - 1}
}

// CheckUsed returns an error when the shadow has nothing to do: no site
// of the model runs a strategy other than collective, or a pattern of
// cfg.Sites selects none of those (a typo, a layer the model lacks, or
// sites that run collective). Call it once the model's sites are built.
func (s *Shadow) CheckUsed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var bad []string
	for _, p := range s.cfg.Sites {
		if !s.unused[p] {
			continue
		}
		if n := s.skipped[p]; n > 0 {
			bad = append(bad, fmt.Sprintf("%q matches only sites that run collective (%d), the reference itself", p, n))
		} else {
			bad = append(bad, fmt.Sprintf("%q matches no communication site of this model (expected a site kind: %s, or a pattern of layer names such as \"blocks.0.attn.qkv\")", p, kindList()))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("shadow: sites %s", strings.Join(bad, "; "))
	}
	if len(s.sites) == 0 {
		return errors.New("shadow: every communication site of this run runs collective, the reference the shadow compares with: nothing to shadow (choose a pipelined or fused strategy for some sites, or leave shadow mode off)")
	}
	return nil
}

// Sites returns the shadowed sites, "name (kind, strategy)", in the order
// they were built.
func (s *Shadow) Sites() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.sites))
	for i, st := range s.sites {
		out[i] = fmt.Sprintf("%s (%s, %s)", st.name, st.kind, st.strategy)
	}
	return out
}

// BeginStep starts training step step: it is sampled when it is a
// multiple of Every.
func (s *Shadow) BeginStep(step int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.step, s.sampled = step, step%s.cfg.Every == 0
	for _, st := range s.sites {
		st.step = [numSlots]slotRecord{}
	}
}

// Sampled reports whether the current step is sampled.
func (s *Shadow) Sampled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sampled
}

// Failure returns the error of the first sampled step whose difference
// exceeded FailAbove (nil: none).
func (s *Shadow) Failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// ShadowSite is a shadowed site's handle on its rank's Shadow: whether the
// current step is sampled, and where the site's comparisons go. The TP
// sites' decorators use it, and so does the MoE expert path's
// (parallel/ep), which the chooser cannot wrap itself.
type ShadowSite struct {
	sh *Shadow
	i  int
}

// Sampled reports whether the current step is sampled.
func (s *ShadowSite) Sampled() bool { return s != nil && s.sh.Sampled() }

// Compare compares got (the strategy's) with want (collective's), tensors
// of backend b (read back to the host), and records the difference in
// slot (SlotOut, SlotDX, SlotDW) of the site's current step: the worst of
// the step's comparisons in that slot.
func (s *ShadowSite) Compare(b tensor.Backend, slot int, got, want *tensor.Tensor) error {
	d, err := CompareOn(b, got, want)
	if err != nil {
		return fmt.Errorf("shadow: site %s: %w", s.sh.sites[s.i].name, err)
	}
	s.Record(slot, d)
	return nil
}

// Record records a difference in slot of the site's current step.
func (s *ShadowSite) Record(slot int, d Diff) {
	s.sh.mu.Lock()
	defer s.sh.mu.Unlock()
	r := &s.sh.sites[s.i].step[slot]
	if r.n == 0 || d.Worse(r.d) {
		r.d = d
	}
	r.n++
}
