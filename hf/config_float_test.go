package hf

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/layers"
)

// Whole float values are written with a decimal point, which transformers'
// strict config classes require of float fields.
func TestConfigFloatsHaveDecimalPoints(t *testing.T) {
	c, err := ConfigOf(layers.GPTConfig{Layers: 1, Dim: 8, Heads: 2, Vocab: 16, Seq: 4, Experts: 2, TopK: 1, MoEEvery: 1, RopeTheta: 10000})
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"router_jitter_noise":0.0`, `"attention_dropout":0.0`, `"rope_theta":10000.0`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("config %s: want %s", js, want)
		}
	}
	var back Config
	if err := json.Unmarshal(js, &back); err != nil || back.RopeTheta != 10000 {
		t.Errorf("read back: %+v, %v", back, err)
	}
}
