package train

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// TestRunLateExtraMetrics: WithLateExtraMetrics' function is called right
// after each step's backward and the one it returns when the step is read
// back, after the next step is queued; each metrics.jsonl record holds the
// fields of its own step; an error from a late read stops the run naming
// the step.
func TestRunLateExtraMetrics(t *testing.T) {
	cfg := smallConfig(t.TempDir(), 4)
	b := newCPU()
	m := &lateBigram{&asyncBigram{bigram: newBigram(t, b, 256, tensor.Float32, 1)}}
	late := func(step int) func() (map[string]any, error) {
		m.calls = append(m.calls, fmt.Sprintf("queue%d", step))
		return func() (map[string]any, error) {
			m.calls = append(m.calls, fmt.Sprintf("read%d", step))
			return map[string]any{"of_step": step}, nil
		}
	}
	if _, err := Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}), WithLateExtraMetrics(late)); err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, c := range m.calls {
		if strings.HasPrefix(c, "queue") || strings.HasPrefix(c, "read") || c == "ForwardAsync" {
			order = append(order, c)
		}
	}
	want := "ForwardAsync queue1 ForwardAsync queue2 read1 ForwardAsync queue3 read2 ForwardAsync queue4 read3 read4"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
	recs, err := ReadMetrics(filepath.Join(cfg.OutDir, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if v, _ := r.Extra["of_step"].(float64); int(v) != r.Step {
			t.Errorf("step %d's record holds the late fields of step %v", r.Step, r.Extra["of_step"])
		}
	}

	cfg = smallConfig(t.TempDir(), 4)
	m = &lateBigram{&asyncBigram{bigram: newBigram(t, b, 256, tensor.Float32, 1)}}
	bad := func(step int) func() (map[string]any, error) {
		return func() (map[string]any, error) {
			if step == 2 {
				return nil, errors.New("stats read failed")
			}
			return nil, nil
		}
	}
	_, err = Run(context.Background(), b, m, loaderFor(t, cfg), cfg, WithOutput(&bytes.Buffer{}), WithLateExtraMetrics(bad))
	testutil.ErrorContains(t, err, "train: step 2: metrics: stats read failed")
}
