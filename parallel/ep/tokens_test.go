package ep_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/testutil"
	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// TestTokenGroup: over a world of 4 ranks, each with its own tokens, EP
// groups of 1 and 2 ranks with the world as the token group give what the
// single-rank layer gives over all the world's tokens — the aux loss and
// statistics of every token, the capacity and drops in world order — once
// the router gradients are summed over the world and the expert gradients
// over the EDP group.
func TestTokenGroup(t *testing.T) {
	const W = 4
	for _, sc := range scenarios() {
		ref := reference(t, sc)
		rs := ref.stats[0]
		for _, P := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/ep=%d", sc.name, P), func(t *testing.T) {
				C, T := sc.cfg.Dim, sc.tokens
				xAll := sc.inputs()
				dAll := testutil.RandFloats(testutil.Rng(4), T*C, 0.1, 1)
				split := splits[W]
				lo := make([]int, W+1)
				for r, n := range split {
					lo[r+1] = lo[r] + n
				}
				type rankOut struct {
					out, dx, routerG []float64
					expertG          map[string][]float64
					aux              float64
					stats            layers.MoEStats
				}
				outs := make([]rankOut, W)
				err := local.Run(W, func(c comm.Comm) error {
					g, err := comm.NewGrid(c, W, 1, P)
					if err != nil {
						return err
					}
					defer g.Close()
					r := c.Rank()
					b, ps := cpu.New(), layers.NewParamSet(seed)
					m, err := ep.New(b, ps, ep.Parallel{Group: g.EPGroup, TokenGroup: g.World}, "moe", sc.cfg)
					if err != nil {
						return err
					}
					if err := ps.Materialize(b, tensor.Float32); err != nil {
						return err
					}
					sc.tweak(t, b, m.Router.W.W)
					n := split[r]
					x := upload(b, xAll[lo[r]*C:lo[r+1]*C], n, C)
					dout := upload(b, dAll[lo[r]*C:lo[r+1]*C], n, C)
					out, dx := b.Zeros(tensor.Float32, n, C), b.Zeros(tensor.Float32, n, C)
					if err := m.Forward(out, x); err != nil {
						return err
					}
					if err := m.Backward(dx, dout); err != nil {
						return err
					}
					// The expert gradients summed over the EDP group.
					for _, p := range m.ExpertParams() {
						w, err := g.EDPGroup.AllReduce(p.G, comm.Sum, nil)
						if err == nil {
							err = w.Wait(nil)
						}
						if err != nil {
							return err
						}
					}
					o := rankOut{expertG: map[string][]float64{}}
					o.out, o.dx, o.routerG = download(t, b, out), download(t, b, dx), download(t, b, m.Router.W.G)
					for _, p := range m.ExpertParams() {
						o.expertG[p.Name] = download(t, b, p.G)
					}
					o.aux, o.stats = m.AuxLoss(), m.Stats()
					outs[r] = o
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				var out, dx []float64
				routerG := make([]float64, len(ref.routerG))
				expertG := map[string][]float64{}
				for r, o := range outs {
					out, dx = append(out, o.out...), append(dx, o.dx...)
					for i, v := range o.routerG {
						routerG[i] += v
					}
					if r < P { // one EP group holds every expert once
						for name, g := range o.expertG {
							expertG[name] = append(expertG[name], g...)
						}
					}
					if math.Abs(o.aux-ref.aux[0]) > tol*math.Abs(ref.aux[0]) {
						t.Errorf("rank %d: aux loss %v, want %v", r, o.aux, ref.aux[0])
					}
					if !slices.Equal(o.stats.TokensPerExpert, rs.TokensPerExpert) || o.stats.Dropped != rs.Dropped || o.stats.Tokens != rs.Tokens {
						t.Errorf("rank %d: stats %+v, want %+v", r, o.stats, rs)
					}
				}
				testutil.AllClose(t, "out", out, ref.out, tol)
				testutil.AllClose(t, "dx", dx, ref.dx, tol)
				testutil.AllClose(t, "router grad (summed over the world)", routerG, ref.routerG, tol)
				for name, want := range ref.expertG {
					testutil.AllClose(t, name+" grad", expertG[name], want, tol)
				}
			})
		}
	}
}

// A token group must be a multiple of the EP group with matching ranks.
func TestTokenGroupErrors(t *testing.T) {
	err := local.Run(4, func(c comm.Comm) error {
		g, err := comm.NewGrid(c, 2, 2, 2)
		if err != nil {
			return err
		}
		defer g.Close()
		b := cpu.New()
		// The DP group (ranks 0, 2 or 1, 3) as the token group of the EP
		// group (0, 1 or 2, 3): its ranks modulo 2 are not the EP ranks on
		// every rank.
		_, err = ep.New(b, layers.NewParamSet(1), ep.Parallel{Group: g.EPGroup, TokenGroup: g.DPGroup}, "moe", baseCfg)
		if c.Rank() == 1 || c.Rank() == 2 {
			if err == nil {
				return fmt.Errorf("rank %d: the DP group accepted as the token group", c.Rank())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
