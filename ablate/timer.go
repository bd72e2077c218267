package ablate

import (
	"time"

	"github.com/asynctp/asynctp/tensor"
)

// Timer times one call of fn on this rank: its queued work from start to
// end. The GPU ranks time with CUDA events on the backend's stream
// (cmd/ablate); the CPU uses WallTimer.
type Timer interface {
	Time(fn func() error) (time.Duration, error)
}

// WallTimer times on the host clock, waiting for the backend's queued work
// before and after.
type WallTimer struct{ Backend tensor.Backend }

// Time is the wall time of fn and the work it queued.
func (w WallTimer) Time(fn func() error) (time.Duration, error) {
	if err := w.Backend.Sync(); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := fn(); err != nil {
		return 0, err
	}
	err := w.Backend.Sync()
	return time.Since(start), err
}
