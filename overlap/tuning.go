package overlap

// Tuning is an autotune cache as the chooser consults it for the sites
// configured "auto": for a site like sp it gives the strategy to use, a
// correct one measured faster than collective beyond the noise, else
// collective (cmd/ablate writes such a cache; the ablate package's Lookup
// implements this interface).
type Tuning interface {
	// Tuned returns the strategy name for the site of sp and where the
	// choice comes from ("autotune cache c.json: all-gather-matmul M 512
	// K 64 N 48, world 2, local, cpu"); ok is false when the cache has no
	// entry for such a site.
	Tuned(sp Spec) (name, from string, ok bool)
}

// ChooserOption configures a Chooser (NewChooser).
type ChooserOption func(*Chooser)

// WithTuning makes "auto" pick from t: a site t has an entry for gets the
// strategy t names (when this run can build it for the site), any other
// site gets collective, and the summary says which and why.
func WithTuning(t Tuning) ChooserOption { return func(c *Chooser) { c.tuning = t } }

// Describer is an optional interface of a Strategy: how a site of sp moves
// its data ("copy-engine pulls from symmetric memory"), and whether over
// the group's symmetric memory (else its collectives). The chooser's
// summary says it per site kind, with the transport (WithTransports).
type Describer interface {
	// Via is how a site of sp moves its data, and whether over symmetric
	// memory ("" says nothing: the summary then names the collectives).
	Via(sp Spec) (how string, symmetric bool)
}

// WithTransports names the run's transports for the summary: the one of
// the groups' collectives and the one of their symmetric memory ("" where
// the run has none).
func WithTransports(collectives, symmetric string) ChooserOption {
	return func(c *Chooser) { c.collT, c.symT = collectives, symmetric }
}
