package main

import (
	"fmt"

	"github.com/asynctp/asynctp/overlap"
)

// Shadow mode (overlap.Shadow): on sampled steps every site whose strategy
// is not collective also runs collective, and the differences go to
// metrics.jsonl and a table at the end of the run. It is on with
// --shadow-every or a "shadow" section in the config (whose every defaults
// to overlap.DefaultShadowEvery). A run that has nothing to compare — one
// rank in one process (no communication sites), or every site configured
// collective — refuses it; so does a model whose sites all run collective
// or which no pattern of "sites" selects, once its sites are built
// (Shadow.CheckUsed).

// checkShadow validates the shadow section and fills in the default rate:
// an every of 0 given explicitly is refused (the default is for a section
// that leaves every out), and config.json then records the rate used.
func (c *Config) checkShadow() error {
	s := c.Shadow
	if s == nil {
		return nil
	}
	if s.Every == 0 && c.explicit["shadow.every"] {
		return fmt.Errorf("shadow: every 0 (--shadow-every): expected a number of steps ≥ 1; leave every out for the default, %d, or the \"shadow\" section and --shadow-every out for no shadow mode", overlap.DefaultShadowEvery)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Every == 0 {
		s.Every = overlap.DefaultShadowEvery
	}
	return nil
}

// checkShadowEffect refuses shadow mode on a run that has nothing to
// compare: one rank in one process (the single-rank model has no
// communication sites), or an overlap configuration that gives every site
// collective, the reference itself.
func (c *Config) checkShadowEffect(flags map[string]bool, file string, l origin) error {
	if c.Shadow == nil {
		return nil
	}
	why := ""
	switch {
	case oneRank(c.Parallel, l):
		why = "a run of one rank in one process has no communication sites; shadow mode compares a site's strategy with collective on a parallel layout (--tp, --dp, --ep, --world)"
	case !mayShadow(c.Overlap):
		why = "every communication site runs collective (--overlap " + orDefault(c.Overlap.Default, "collective") + "), the reference shadow mode compares with; choose --overlap pipelined, fused or auto, or per-site strategies in the \"overlap\" section"
	default:
		return nil
	}
	if flags["shadow-every"] {
		return fmt.Errorf("--shadow-every %d cannot take effect: %s", c.Shadow.Every, why)
	}
	return fmt.Errorf("config %s: the \"shadow\" section cannot take effect: %s", file, why)
}

// mayShadow reports whether any site may run a strategy other than
// collective under c.
func mayShadow(c overlap.Config) bool {
	if c.Default != "" && c.Default != "collective" {
		return true
	}
	for _, v := range c.Sites {
		if v != "collective" {
			return true
		}
	}
	return false
}
