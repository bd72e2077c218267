package overlap

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Names of the strategies a configuration may name. "auto" picks per site
// from an autotune cache (WithTuning; cmd/ablate writes one); a site the
// cache has no entry for, or a run without a cache, gets collective, and
// the summary says so.
var Names = []string{"collective", "pipelined", "fused", "auto"}

// Config chooses a strategy for each site: the JSON "overlap" section of a
// run's configuration and the --overlap flag.
//
//	{"default": "pipelined", "sites": {"matmul-reduce-scatter": "collective", "blocks.0.*": "collective"}}
//
// A key of Sites is a site kind (Kinds) or a pattern over layer names
// (path.Match syntax: "blocks.*.attn.qkv"); a layer name pattern wins over
// a kind. The default applies to every site that has the strategy; a site
// kind that has none keeps collective, and the summary says so. A strategy
// named in Sites must exist for every site it matches, or building the
// model fails, naming the site and why.
type Config struct {
	Default string            `json:"default,omitempty"` // the strategy of every site no key of Sites matches ("": collective)
	Sites   map[string]string `json:"sites,omitempty"`   // strategy by site kind or pattern of layer names
}

// Validate checks the names and patterns, without building anything.
func (c Config) Validate() error {
	if c.Default != "" && !slices.Contains(Names, c.Default) {
		return fmt.Errorf("overlap: default strategy %q: expected one of %s", c.Default, strings.Join(Names, ", "))
	}
	for key, name := range c.Sites {
		if !slices.Contains(Names, name) {
			return fmt.Errorf("overlap: site %q: strategy %q: expected one of %s", key, name, strings.Join(Names, ", "))
		}
		if _, err := path.Match(key, ""); err != nil {
			return fmt.Errorf("overlap: site pattern %q: %v", key, err)
		}
	}
	return nil
}

// Chooser maps each site's spec to a strategy, from a Config and the
// strategies this run can build (which depend on the transport).
// It records its choices for the start-up summary. Safe for concurrent use
// (goroutine ranks share one).
type Chooser struct {
	cfg       Config
	available map[string]Strategy
	missing   map[string]string // strategy name → why this run cannot build it
	tuning    Tuning            // what "auto" consults; nil: no cache
	shadow    *Shadow           // the rank's shadow mode; nil: off
	collT     string            // the transports, for the summary (WithTransports)
	symT      string

	mu      sync.Mutex
	choices map[Kind]map[string]*choice // kind → strategy → its sites
	notes   map[Kind]string             // kind → why the default did not apply
	used    map[string]bool             // the Sites keys that chose a site
}

// choice is what the summary says of the sites of one kind that got one
// strategy.
type choice struct {
	sites int
	via   string          // how they move their data (Chooser.via)
	froms map[string]bool // what asked for it (the default, sites[...])
}

// newChooser is a chooser of cfg, unchecked, with collective and the
// strategies of available.
func newChooser(cfg Config, available []Strategy) *Chooser {
	c := &Chooser{cfg: cfg, available: map[string]Strategy{"collective": Collective{}}, missing: map[string]string{},
		choices: map[Kind]map[string]*choice{}, notes: map[Kind]string{}, used: map[string]bool{}}
	for _, s := range available {
		c.available[s.Name()] = s
	}
	return c
}

// NewChooser validates cfg against the strategies available in this run;
// missing says, for each strategy this run cannot build, why ("fused needs
// --comm nvshmem"). Collective is always available.
func NewChooser(cfg Config, available []Strategy, missing map[string]string, opts ...ChooserOption) (*Chooser, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := newChooser(cfg, available)
	for _, o := range opts {
		o(c)
	}
	for k, v := range missing {
		if _, ok := c.available[k]; !ok {
			c.missing[k] = v
		}
	}
	if d := cfg.Default; d != "" && d != "auto" {
		if _, err := c.lookup(d); err != nil {
			return nil, fmt.Errorf("overlap: default strategy: %w", err)
		}
	}
	for key, name := range cfg.Sites {
		if name == "auto" {
			continue
		}
		if _, err := c.lookup(name); err != nil {
			return nil, fmt.Errorf("overlap: site %q: %w", key, err)
		}
	}
	return c, nil
}

func (c *Chooser) lookup(name string) (Strategy, error) {
	if s, ok := c.available[name]; ok {
		return s, nil
	}
	if why, ok := c.missing[name]; ok {
		return nil, fmt.Errorf("strategy %s is not available in this run: %s (%w)", name, why, ErrUnavailable)
	}
	return nil, fmt.Errorf("strategy %s is not available in this run (%w)", name, ErrUnavailable)
}

// Choose returns the strategy for the site of sp.
func (c *Chooser) Choose(sp Spec) (Strategy, error) {
	name, explicit, from, key := c.cfg.Default, false, "the default", ""
	if kindName, ok := c.cfg.Sites[string(sp.Kind)]; ok {
		name, explicit, from, key = kindName, true, fmt.Sprintf("sites[%q]", sp.Kind), string(sp.Kind)
	}
	keys := make([]string, 0, len(c.cfg.Sites))
	for k := range c.cfg.Sites {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the most specific (longest) pattern wins; ties by name
	sort.SliceStable(keys, func(i, j int) bool { return len(keys[i]) > len(keys[j]) })
	for _, k := range keys {
		if ok, _ := path.Match(k, sp.Name); ok && sp.Name != "" {
			name, explicit, from, key = c.cfg.Sites[k], true, fmt.Sprintf("sites[%q]", k), k
			break
		}
	}
	note := ""
	switch name {
	case "", "collective":
		name = "collective"
	case "auto":
		name, note = c.auto(sp)
	}
	asked := from // what the summary says asked for the strategy
	if note != "" {
		asked = "" // auto: the note says why
	}
	s, err := c.lookup(name)
	if err == nil {
		err = s.Supports(sp)
	}
	if err != nil {
		if explicit || !errors.Is(err, ErrUnavailable) {
			return nil, fmt.Errorf("%s: %s asks for %s: %w", sp.what(), from, name, err)
		}
		note = strings.TrimPrefix(err.Error(), "overlap: ")
		s, asked = Collective{}, "" // the note says why
	}
	c.record(sp.Kind, s.Name(), note, key, c.via(s, sp), asked)
	return s, nil
}

// via says how a site of sp moves its data with s, and over which
// transport (WithTransports), for the summary.
func (c *Chooser) via(s Strategy, sp Spec) string {
	how, sym := "the group's collectives", false
	if d, ok := s.(Describer); ok {
		if h, y := d.Via(sp); h != "" {
			how, sym = h, y
		}
	}
	switch {
	case sym && c.symT != "":
		how += " over " + c.symT
	case !sym && c.collT != "":
		how += " over " + c.collT
	}
	return how
}

// auto is the strategy "auto" picks for sp, and the note that says why.
func (c *Chooser) auto(sp Spec) (name, note string) {
	if c.tuning == nil {
		return "collective", "auto: no autotune cache yet, so collective"
	}
	name, from, ok := c.tuning.Tuned(sp)
	if !ok {
		return "collective", "auto: the autotune cache has no entry for this site, so collective"
	}
	s, err := c.lookup(name)
	if err == nil {
		err = s.Supports(sp)
	}
	if err != nil {
		return "collective", fmt.Sprintf("auto: %s picks %s, which cannot run here (%v), so collective", from, name, err)
	}
	return name, "auto: " + from
}

func (c *Chooser) record(k Kind, name, note, key, via, from string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if key != "" {
		c.used[key] = true
	}
	if c.choices[k] == nil {
		c.choices[k] = map[string]*choice{}
	}
	ch := c.choices[k][name]
	if ch == nil {
		ch = &choice{froms: map[string]bool{}}
		c.choices[k][name] = ch
	}
	ch.sites++
	ch.via = via
	if from != "" {
		ch.froms[from] = true
	}
	if note != "" {
		c.notes[k] = note
	}
}

// CheckUsed returns an error naming the keys of the configuration's Sites
// that chose no site (a typo, or a layer this model does not have); call it
// once the model's sites are built.
func (c *Chooser) CheckUsed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var kinds, patterns []string // unused keys that name a site kind, and the others
	for k := range c.cfg.Sites {
		if c.used[k] {
			continue
		}
		if slices.Contains(Kinds, Kind(k)) {
			kinds = append(kinds, fmt.Sprintf("%q", k))
		} else {
			patterns = append(patterns, fmt.Sprintf("%q", k))
		}
	}
	if len(kinds)+len(patterns) == 0 {
		return nil
	}
	sort.Strings(kinds)
	sort.Strings(patterns)
	var has []string
	for _, k := range Kinds {
		if len(c.choices[k]) > 0 {
			has = append(has, string(k))
		}
	}
	present := "it has no communication sites"
	if len(has) > 0 {
		present = "its sites are of the kinds " + strings.Join(has, ", ")
	}
	var errs []string
	if len(kinds) > 0 {
		errs = append(errs, fmt.Sprintf("sites %s name site kinds this model has no site of (%s)", strings.Join(kinds, ", "), present))
	}
	if len(patterns) > 0 {
		errs = append(errs, fmt.Sprintf("sites %s match no communication site of this model: expected a site kind (%s) or a pattern of layer names such as \"blocks.0.attn.qkv\"", strings.Join(patterns, ", "), kindList()))
	}
	return fmt.Errorf("overlap: %s", strings.Join(errs, "; "))
}

func kindList() string {
	ks := make([]string, len(Kinds))
	for i, k := range Kinds {
		ks[i] = string(k)
	}
	return strings.Join(ks, ", ")
}

// Summary says which strategy each site kind got, one line per kind that
// has sites, how the sites move their data and over which transport, and
// why: what asked for it ("all-gather-matmul: pipelined (4 sites,
// copy-engine pulls from symmetric memory over nvshmem) as the default
// asks"), or, where the default did not apply, the reason after the
// strategies ("; pipelined for expert site ...: group ep[0 8] spans hosts:
// ...").
func (c *Chooser) Summary() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, k := range Kinds {
		m := c.choices[k]
		if len(m) == 0 {
			continue
		}
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		parts := make([]string, len(names))
		for i, n := range names {
			ch := m[n]
			unit := "sites"
			if ch.sites == 1 {
				unit = "site"
			}
			parts[i] = fmt.Sprintf("%s (%d %s, %s)", n, ch.sites, unit, ch.via)
			if len(ch.froms) > 0 {
				froms := make([]string, 0, len(ch.froms))
				for f := range ch.froms {
					froms = append(froms, f)
				}
				sort.Strings(froms)
				verb := "asks"
				if len(froms) > 1 {
					verb = "ask"
				}
				parts[i] += fmt.Sprintf(" as %s %s", strings.Join(froms, " and "), verb)
			}
		}
		line := fmt.Sprintf("%s: %s", k, strings.Join(parts, ", "))
		if note := c.notes[k]; note != "" {
			line += "; " + note
		}
		out = append(out, line)
	}
	return out
}

// AllGatherMatmul builds the site of sp with its chosen strategy.
func (c *Chooser) AllGatherMatmul(sp Spec) (AllGatherMatmul, error) {
	return buildSite(c, sp, KindAllGatherMatmul, Builder.NewAllGatherMatmul,
		func(real, ref AllGatherMatmul, sh *ShadowSite, sp Spec) AllGatherMatmul {
			return &shadowAGMM{real: real, ref: ref, site: sh, sp: sp}
		})
}

// MatmulReduceScatter builds the site of sp with its chosen strategy.
func (c *Chooser) MatmulReduceScatter(sp Spec) (MatmulReduceScatter, error) {
	return buildSite(c, sp, KindMatmulReduceScatter, Builder.NewMatmulReduceScatter,
		func(real, ref MatmulReduceScatter, sh *ShadowSite, sp Spec) MatmulReduceScatter {
			return &shadowMMRS{real: real, ref: ref, site: sh, sp: sp}
		})
}

// MatmulAllReduce builds the site of sp with its chosen strategy.
func (c *Chooser) MatmulAllReduce(sp Spec) (MatmulAllReduce, error) {
	return buildSite(c, sp, KindMatmulAllReduce, Builder.NewMatmulAllReduce,
		func(real, ref MatmulAllReduce, sh *ShadowSite, sp Spec) MatmulAllReduce {
			return &shadowMMAR{real: real, ref: ref, site: sh, sp: sp}
		})
}

// buildSite builds the site of sp, of kind k, with build on its chosen
// strategy; when the shadow covers it, also on collective, and returns
// shadow's decorator of the two.
func buildSite[S interface{ Close() error }](c *Chooser, sp Spec, k Kind, build func(Builder, Spec) (S, error),
	shadow func(real, ref S, sh *ShadowSite, sp Spec) S) (S, error) {
	var none S
	sp.Kind = k
	s, err := c.Choose(sp)
	if err != nil {
		return none, err
	}
	site, err := build(s, sp)
	if err != nil {
		return none, err
	}
	if sh := c.shadowSite(sp, s); sh != nil {
		ref, err := build(Collective{}, sp)
		if err != nil {
			return none, errors.Join(err, site.Close())
		}
		return shadow(site, ref, sh, sp), nil
	}
	return site, nil
}

// Single is a chooser that gives every site the strategy s (tests, and
// layers built without a configuration).
func Single(s Strategy) *Chooser {
	c, _ := NewChooser(Config{Default: s.Name()}, []Strategy{s}, nil)
	if c == nil { // a strategy name outside Names: build it directly
		c = newChooser(Config{Default: s.Name()}, []Strategy{s})
	}
	return c
}
