package train

import (
	"math"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
)

func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig does not validate: %v", err)
	}
	// Meaningful zeros stay zero.
	if c.WeightDecay != 0 || c.GradClip != 0 || c.Warmup != 0 {
		t.Errorf("WithDefaults changed a meaningful zero: %+v", c)
	}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Steps = -1 }, "steps = -1"},
		{func(c *Config) { c.MinLR = 1 }, "min_lr"},
		{func(c *Config) { c.Warmup = 2000 }, "warmup = 2000"},
		{func(c *Config) { c.Beta2 = 1 }, "beta2 = 1"},
		{func(c *Config) { c.LR = math.NaN() }, "lr = NaN"},
		{func(c *Config) { c.GradClip = -1 }, "grad_clip"},
		{func(c *Config) { c.KeepCheckpoints = -2 }, "keep_checkpoints"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		testutil.ErrorContains(t, c.Validate(), tc.want)
	}
}
