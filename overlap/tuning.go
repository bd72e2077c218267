package overlap

// Tuning is an autotune cache as the chooser consults it for the sites
// configured "auto": for a site like sp it gives the strategy measured
// fastest among the correct ones (cmd/ablate writes such a cache; the
// ablate package's Cache implements this interface).
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
