package ablate

import (
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Registry is overlap/strategies' registry (strategies.All(o): one type
// per name) by name, the names the matrix uses (Strategies).
func Registry(o strategies.Options) map[string]overlap.Strategy {
	m := map[string]overlap.Strategy{}
	for _, s := range strategies.All(o) {
		m[s.Name()] = s
	}
	return m
}

// LocalStrategies are the strategies the CPU ranks run, by matrix name:
// the registry's but fused, which needs GPUs with symmetric memory.
func LocalStrategies() map[string]overlap.Strategy {
	m := Registry(strategies.Options{})
	delete(m, Fused)
	return m
}

// RunLocal runs cells of one world on goroutine ranks over comm/local,
// each rank on its own single-threaded CPU backend; done, when not nil,
// sees rank 0's results as they come. It returns rank 0's results.
func RunLocal(world int, cells []Cell, strategies map[string]overlap.Strategy, warmup, reps int, seed uint64, timeout time.Duration, done func(Result)) ([]Result, error) {
	var out []Result
	err := local.Run(world, func(g comm.Comm) error {
		b := cpu.New(cpu.WithThreads(1))
		r := &Rank{Group: g, Backend: b, Timer: WallTimer{Backend: b}, Strategies: strategies, Seed: seed, Warmup: warmup, Reps: reps, Collectives: "local"}
		if g.Rank() == 0 {
			r.Done = done
		}
		rs, err := r.Run(cells)
		if g.Rank() == 0 {
			out = rs
		}
		return err
	}, local.WithTimeout(timeout))
	return out, err
}
