package pes

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// Each runs run on every world size n of sizes, in a subtest "PEs=n", and
// logs the lines of every PE's output that start with prefix.
func Each(t *testing.T, sizes []int, prefix string, run func(t *testing.T, n int) []string) {
	for _, n := range sizes {
		t.Run(fmt.Sprintf("PEs=%d", n), func(t *testing.T) {
			for _, out := range run(t, n) {
				for _, l := range Lines(out, prefix) {
					t.Log(l)
				}
			}
		})
	}
}

// Lines are the lines of out that start with prefix.
func Lines(out, prefix string) []string {
	var ls []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			ls = append(ls, l)
		}
	}
	return ls
}

// Timer times one call of fn.
type Timer func(fn func() error) (time.Duration, error)

// Median runs fn warm times, waits for it (sync) and meets the peers
// (barrier), then times reps calls with timed and returns the median.
func Median(warm, reps int, sync, barrier func() error, timed Timer, fn func() error) (time.Duration, error) {
	if reps < 1 {
		return 0, fmt.Errorf("pes.Median: %d repetitions, expected at least 1", reps)
	}
	for range warm {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	if err := sync(); err != nil {
		return 0, err
	}
	if err := barrier(); err != nil {
		return 0, err
	}
	ds := make([]time.Duration, 0, reps)
	for range reps {
		d, err := timed(fn)
		if err != nil {
			return 0, err
		}
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], nil
}

// WallTimer times fn by the wall clock up to sync (for CPU backends).
func WallTimer(sync func() error) Timer {
	return func(fn func() error) (time.Duration, error) {
		start := time.Now()
		if err := fn(); err != nil {
			return 0, err
		}
		err := sync()
		return time.Since(start), err
	}
}

// EventTimer times fn on b's stream with CUDA events (Backend.TimeEvents).
func EventTimer(b *cudabackend.Backend) Timer { return b.TimeEvents }

// Time is the benchmarks' timing of fn on this PE: three warm-up calls,
// then the median of reps, by CUDA events on the backend's stream, after
// every PE has reached the same point.
func (p *PE) Time(reps int, fn func() error) (time.Duration, error) {
	return Median(3, reps, p.B.Sync, p.World.Barrier, EventTimer(p.B), fn)
}
