//go:build asynctp_emu

package peerep

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
)

// collectivesOnly hides every capability of a group but its collectives:
// the collective side of a hybrid world has no symmetric memory.
type collectivesOnly struct{ comm.Comm }

// hybridWrap makes each emulated rank's group a hybrid of two transports,
// as --comm nccl+nvshmem does on GPUs: the collectives of a second
// comm/local world (device tensors staged through the host) and the
// symmetric memory of the rank's emuworld.Sym (the registry of emulated
// allocations: peer pointers are the other ranks' buffers).
func hybridWrap(P int) func(c *emuworld.Sym) comm.Comm {
	coll := local.NewWorld(P, local.WithTimeout(120*time.Second))
	return func(c *emuworld.Sym) comm.Comm {
		side := emuworld.Staged{Comm: coll[c.Rank()], B: c.B}
		h, err := hybrid.New(collectivesOnly{side}, c)
		if err != nil {
			panic(err) // the same ranks on both sides by construction
		}
		return h
	}
}

// TestEmuHybridMatchesCollective: in a world of two transports (the
// collectives of one comm/local world, the symmetric memory of another),
// the expert path's pipelined (device step) and fused (stream hooks)
// strategies give the bits of the collective dispatcher run on the
// collectives alone — output, input gradient, every weight gradient, the
// aux loss — at EP 2 and 4, f32 and bf16, with capacity drops; the
// collective dispatcher gives the same bits in the hybrid world as on its
// own.
func TestEmuHybridMatchesCollective(t *testing.T) {
	for _, tc := range []struct {
		P      int
		cf     float64
		tokens []int
	}{{2, 1, []int{9, 4}}, {4, 0, []int{5, 3, 8, 6}}} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("P%d/%v", tc.P, dt), func(t *testing.T) {
				cfg := layers.MoEConfig{Dim: 16, Hidden: 24, Experts: 8, TopK: 2, CapacityFactor: tc.cf,
					AuxLossCoef: 0.01, ZLossCoef: 0.001, Std: 0.5, OutStd: 0.3}
				const maxTok, steps = 9, 2
				run := func(wrap func(*emuworld.Sym) comm.Comm, st func(bar *emuworld.Barrier) overlap.Strategy) []moeResult {
					return moeRun(t, tc.P, cfg, dt, tc.tokens, maxTok, steps, moeRunOpts{st: st, params: 23, rng: [2]uint64{5, 77}, wrap: wrap,
						aux: float64(tc.P)})
				}
				col := run(nil, nil)
				for _, s := range append([]deviceStrategy{{"collective", nil}}, deviceStrategies...) {
					got := run(hybridWrap(tc.P), s.st)
					nonzero := false
					for r := range tc.P {
						g, w := got[r], col[r]
						vals := [][2][]float64{{g.out, w.out}, {g.dx, w.dx}, {{g.aux}, {w.aux}}}
						for i := range w.grads {
							vals = append(vals, [2][]float64{g.grads[i], w.grads[i]})
						}
						for k, v := range vals {
							if len(v[0]) != len(v[1]) {
								t.Fatalf("%s rank %d value set %d: %d values, collective %d", s.name, r, k, len(v[0]), len(v[1]))
							}
							for i := range v[1] {
								if math.Float64bits(v[0][i]) != math.Float64bits(v[1][i]) {
									t.Fatalf("%s in the hybrid world, rank %d value set %d [%d]: %v, collective alone %v (expected identical bits)", s.name, r, k, i, v[0][i], v[1][i])
								}
								nonzero = nonzero || v[1][i] != 0
							}
						}
					}
					if !nonzero {
						t.Fatal("every output and gradient is zero: the comparison proves nothing")
					}
				}
			})
		}
	}
}
