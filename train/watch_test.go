package train

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/tensor"
)

// watcher records the brackets it sees, adds a field on even steps and
// fails at step failAt (0: never).
type watcher struct {
	calls  []string
	failAt int
}

var errWatched = errors.New("the watcher saw something")

func (w *watcher) BeginStep(step int) { w.calls = append(w.calls, fmt.Sprint("begin ", step)) }

func (w *watcher) EndStep(step int) (map[string]any, error) {
	w.calls = append(w.calls, fmt.Sprint("end ", step))
	var fields map[string]any
	if step%2 == 0 {
		fields = map[string]any{"watched": float64(step)}
	}
	if step == w.failAt {
		return fields, errWatched
	}
	return fields, nil
}

// TestStepWatcher: the watcher brackets every step (validation forwards
// are not steps), its fields join the step's metrics, and its error stops
// the run after the step — applied, recorded, checkpointed — with an error
// wrapping it; the losses up to there are the unwatched run's.
func TestStepWatcher(t *testing.T) {
	ref, err := Run(context.Background(), newCPU(), newBigram(t, newCPU(), 256, tensor.Float32, 1), loaderFor(t, smallConfig(t.TempDir(), 6)), smallConfig(t.TempDir(), 6), WithOutput(discard{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, failAt := range []int{0, 4, 6} {
		out := t.TempDir()
		cfg := smallConfig(out, 6)
		w := &watcher{failAt: failAt}
		val := loaderFor(t, cfg)
		res, err := Run(context.Background(), newCPU(), newBigram(t, newCPU(), 256, tensor.Float32, 1), loaderFor(t, cfg), cfg,
			WithOutput(discard{}), WithStepWatcher(w), WithValidation(val, 2, 1))
		last := 6
		if failAt != 0 {
			last = failAt
			if !errors.Is(err, errWatched) {
				t.Fatalf("fail at %d: error %v, expected one wrapping the watcher's", failAt, err)
			}
			testutil.ErrorContains(t, err, fmt.Sprintf("stopped after step %d", failAt), filepath.Join(out, fmt.Sprintf("step-%06d", failAt)))
		} else if err != nil {
			t.Fatal(err)
		}
		var want []string
		for s := 1; s <= last; s++ {
			want = append(want, fmt.Sprint("begin ", s), fmt.Sprint("end ", s))
		}
		if !slices.Equal(w.calls, want) {
			t.Errorf("fail at %d: calls %v, expected %v", failAt, w.calls, want)
		}
		if res.Step != last || res.LastCheckpoint != filepath.Join(out, fmt.Sprintf("step-%06d", last)) || !slices.Equal(res.Losses, ref.Losses[:last]) {
			t.Errorf("fail at %d: result %+v, expected step %d checkpointed with the unwatched losses %v", failAt, res, last, ref.Losses[:last])
		}
		recs, err := ReadMetrics(filepath.Join(out, MetricsFile))
		if err != nil || len(recs) != last {
			t.Fatalf("fail at %d: %d records (%v), expected %d", failAt, len(recs), err, last)
		}
		for _, r := range recs {
			got, ok := r.Extra["watched"]
			if ok != (r.Step%2 == 0) || ok && got != float64(r.Step) {
				t.Errorf("fail at %d: step %d's metrics %v: expected the watcher's field on even steps", failAt, r.Step, r.Extra)
			}
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
