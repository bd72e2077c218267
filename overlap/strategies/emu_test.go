//go:build asynctp_emu

package strategies_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/overlaptest"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
	"github.com/asynctp/asynctp/parallel/ep/peerep"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The kernel emulator's ranks (internal/testing/emuworld): the symmetric
// side of each rank's hybrid group is an emuworld.Sym on a comm/local
// world of its own; with hosts (the host of each world rank) a rank has no
// peer pointer to the ranks of another host, and the hybrid's placement
// (hybrid.WithHosts) says what reaches what. The collective side is
// another comm/local world whose ops on device tensors go through the host
// (emuworld.Staged).

// hybridRanks runs f on P emulated ranks, each with a hybrid group of the
// two worlds; hosts, when set, places the world's ranks on hosts
// (hybrid.WithHosts, and no peer pointers between hosts).
func hybridRanks(t *testing.T, P int, hosts []int, f func(g comm.Comm, b *cudabackend.Backend, bar *emuworld.Barrier) error) {
	t.Helper()
	reg := emuworld.NewRegistry()
	defer reg.CloseAll(t)
	if err := emuworld.HybridRanks(P, reg, hosts, nil, f); err != nil {
		t.Fatal(err)
	}
}

// The registry's pipelined strategy, asked on a hybrid group (collectives
// of one world, symmetric memory of another) whose ranks reach each other,
// builds the peer-copy expert path, which passes the expert path's
// conformance suite (against the float64 reference) at EP 2 and 3; on a
// simulated placement of the ranks on two hosts it refuses, naming the
// ranks it cannot reach.
func TestEmuRegistryOnHybrid(t *testing.T) {
	for _, P := range []int{2, 3} {
		t.Run(fmt.Sprintf("ep=%d", P), func(t *testing.T) {
			hybridRanks(t, P, nil, func(g comm.Comm, b *cudabackend.Backend, bar *emuworld.Barrier) error {
				pipe := strategies.Pipelined{Options: strategies.Options{Expert: []peerep.Option{peerep.WithBeforeWait(bar.Wait)}}}
				sp := overlap.Spec{Kind: overlap.KindExpert, Name: "moe", Group: g, Backend: b, Rows: 16, K: 8, Outs: []int{8}, Experts: 2 * P}
				run, not := strategies.Available(sp, []overlap.Strategy{overlap.Collective{}, pipe, strategies.Fused{}})
				if len(run) != 2 || run[1].Name() != "pipelined" {
					return fmt.Errorf("rank %d: the expert site of a hybrid group runs %v (refused: %v), want collective and pipelined", g.Rank(), run, not)
				}
				if how, sym := pipe.Via(sp); !sym {
					return fmt.Errorf("rank %d: the pipelined expert path moves by %q, want symmetric memory", g.Rank(), how)
				}
				r := eptest.Rank{Group: g, Backend: b, Stream: b.Stream(), DType: tensor.Float32, Seed: uint64(31 + P), Logf: t.Logf,
					NewPath: func(cfg eptest.Config) (ep.ExpertPath, error) {
						return pipe.NewExpertPath(ep.ExpertConfig{Name: "moe", Backend: cfg.Backend, Stream: cfg.Stream, Group: cfg.Group,
							Tokens: cfg.Tokens, Experts: cfg.Experts, Cols: cfg.Cols, MaxTokens: cfg.MaxTokens})
					}}
				if err := r.CheckAll(); err != nil {
					return err
				}
				return b.Sync()
			})
		})
	}
	t.Run("two hosts", func(t *testing.T) {
		hybridRanks(t, 4, []int{0, 0, 1, 1}, func(g comm.Comm, b *cudabackend.Backend, _ *emuworld.Barrier) error {
			sp := overlap.Spec{Kind: overlap.KindExpert, Name: "moe", Group: g, Backend: b, Rows: 16, K: 8, Outs: []int{8}, Experts: 8}
			_, not := strategies.Available(sp, nil)
			far := "group ranks 2, 3 (world ranks 2, 3) are"
			if g.Rank() >= 2 {
				far = "group ranks 0, 1 (world ranks 0, 1) are"
			}
			for _, name := range []string{"pipelined", "fused"} {
				if err := not[name]; err == nil || !strings.Contains(err.Error(), "spans hosts: "+far) {
					return fmt.Errorf("rank %d: %s across two hosts: %v, want a refusal naming %s", g.Rank(), name, err, far)
				}
			}
			return nil
		})
	})
}

// The registry's strategies on a hybrid group whose ranks reach each other
// (the collectives of one comm/local world, the emulated symmetric memory
// of another): the chooser gives the TP sites pipelined in its peer-copy
// form (overlap/peercopy's copy-engine pulls and stream-ordered signal
// words, run by the emulator in issue order with its host waits for the
// words the other ranks write) and says so, and every strategy Available
// offers passes the conformance suite (against the float64 reference, as
// collective does) at TP 2 and 3, in f32 and bf16.
func TestEmuTPSuiteOnHybrid(t *testing.T) {
	for _, P := range []int{2, 3} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("tp=%d/%v", P, dt), func(t *testing.T) {
				hybridRanks(t, P, nil, func(g comm.Comm, b *cudabackend.Backend, _ *emuworld.Barrier) error {
					all := strategies.All(strategies.Options{StreamHooks: true})
					ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, all, nil, overlap.WithTransports("local", "emulated symmetric memory"))
					if err != nil {
						return err
					}
					for _, k := range []overlap.Kind{overlap.KindAllGatherMatmul, overlap.KindMatmulReduceScatter, overlap.KindMatmulAllReduce} {
						sp := overlap.Spec{Kind: k, Name: "blocks.0." + string(k), Group: g, Backend: b, Rows: 8, K: 16, Outs: []int{16}, DType: dt}
						run, not := strategies.Available(sp, all)
						if len(run) < 2 || run[1].Name() != "pipelined" {
							return fmt.Errorf("rank %d: %s site of a hybrid group: runs %v (refused: %v), want collective and pipelined", g.Rank(), k, run, not)
						}
						if s, err := ch.Choose(sp); err != nil || s.Name() != "pipelined" {
							return fmt.Errorf("rank %d: the chooser gives the %s site %v (%v), want pipelined", g.Rank(), k, s, err)
						}
					}
					sum := strings.Join(ch.Summary(), "\n")
					for _, want := range []string{
						"all-gather-matmul: pipelined (1 site, copy-engine pulls from symmetric memory over emulated symmetric memory)",
						"matmul-reduce-scatter: pipelined (1 site, copy-engine pulls from symmetric memory over emulated symmetric memory)",
						"matmul-all-reduce: pipelined (1 site, chunked all-reduces on the group's collectives over local)"} {
						if !strings.Contains(sum, want) {
							return fmt.Errorf("rank %d: summary\n%s\nwant %q", g.Rank(), sum, want)
						}
					}
					for i, s := range all {
						r := overlaptest.Rank{Group: g, Backend: b, Strategy: s, DType: dt, Seed: uint64(41 + 3*P + i)}
						skipped, err := r.CheckAllReport()
						if err != nil {
							return fmt.Errorf("rank %d: %w", g.Rank(), err)
						}
						if err := expectSkipped(s.Name(), dt, skipped); err != nil {
							return fmt.Errorf("rank %d: %w", g.Rank(), err)
						}
					}
					return b.Sync()
				})
			})
		}
	}
}

// expectSkipped checks what the suite skipped of a strategy: nothing of
// collective and pipelined; of fused, in bf16, the matmul∘all-reduce sites
// (no fused form) and the shapes whose widths are not multiples of 8, in
// f32 everything (the engine takes bf16).
func expectSkipped(name string, dt tensor.DType, skipped []string) error {
	var want []string
	if name == "fused" {
		for _, c := range overlaptest.Cases() {
			for _, k := range []overlap.Kind{overlap.KindAllGatherMatmul, overlap.KindMatmulReduceScatter, overlap.KindMatmulAllReduce} {
				fits := dt == tensor.BFloat16 && k != overlap.KindMatmulAllReduce && c.K%8 == 0 &&
					!slices.ContainsFunc(c.Outs, func(m int) bool { return m%8 != 0 })
				if !fits {
					want = append(want, fmt.Sprintf("fused %s %v", k, c))
				}
			}
		}
	}
	if len(skipped) != len(want) {
		return fmt.Errorf("%s %v skipped %d (site kind, shape) pairs, want %d:\n%s", name, dt, len(skipped), len(want), strings.Join(skipped, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(skipped, func(s string) bool { return strings.HasPrefix(s, w+":") }) {
			return fmt.Errorf("%s %v: %q not skipped; skipped:\n%s", name, dt, w, strings.Join(skipped, "\n"))
		}
	}
	return nil
}

// The TP sites of pipelined (peer copies) and fused (stream hooks) in the
// hybrid world against collective on the same inputs: what both compute
// by the same GEMMs over the same rows gives collective's bits (the
// gathered rows and the all-gather∘matmul's outputs, a GEMM per chunk of
// rows; the matmul∘reduce-scatter backward's dx; the weight gradients
// that both compute in one GEMM); the sums of partials, added in another
// order than the collective's reduce-scatter, agree within the dtype's
// tolerance.
func TestEmuTPBitsOnHybrid(t *testing.T) {
	const n, k, m = 7, 40, 24 // rows per rank, inner and output widths (multiples of 8: the fused sites')
	for _, P := range []int{2, 3} {
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			t.Run(fmt.Sprintf("tp=%d/%v", P, dt), func(t *testing.T) {
				hybridRanks(t, P, nil, func(g comm.Comm, b *cudabackend.Backend, _ *emuworld.Barrier) error {
					r := g.Rank()
					rng := rand.New(rand.NewPCG(uint64(r)+1, uint64(P)))
					in := func(rows, cols int) *tensor.Tensor {
						v := make([]float64, rows*cols)
						for i := range v {
							v[i] = rng.Float64()*2 - 1
						}
						h := tensor.MustHost(dt, rows, cols)
						if err := h.SetFloat64s(v); err != nil {
							panic(err)
						}
						d := b.Zeros(dt, rows, cols)
						b.Upload(d, h)
						return d
					}
					x, w, dout := in(n, k), in(m, k), in(P*n, m)    // all-gather∘matmul
					x2, w2, dout2 := in(P*n, k), in(m, k), in(n, m) // matmul∘reduce-scatter
					dw0, dw20 := in(m, k), in(m, k)                 // the weight gradients' start
					type result map[string]*tensor.Tensor           // host copies
					run := func(s overlap.Strategy) (result, error) {
						res := result{}
						keep := func(name string, t *tensor.Tensor) {
							res[name] = tensor.MustHost(dt, t.Shape()...)
							b.Download(res[name], t)
						}
						spec := func(kind overlap.Kind) overlap.Spec {
							return overlap.Spec{Kind: kind, Name: "bits." + string(kind), Group: g, Backend: b, Rows: n, K: k, Outs: []int{m}, DType: dt}
						}
						ag, err := s.NewAllGatherMatmul(spec(overlap.KindAllGatherMatmul))
						if err != nil {
							return nil, err
						}
						defer ag.Close()
						xFull, out, dx, dw := b.Zeros(dt, P*n, k), b.Zeros(dt, P*n, m), b.Zeros(dt, n, k), b.Zeros(dt, m, k)
						b.Copy(dw, dw0)
						if err := ag.Forward([]*tensor.Tensor{out}, xFull, x, []*tensor.Tensor{w}); err != nil {
							return nil, err
						}
						wk, err := ag.Backward(dx, []*tensor.Tensor{dw}, []*tensor.Tensor{dout}, xFull, []*tensor.Tensor{w})
						if err == nil {
							err = wk.Wait(nil)
						}
						if err != nil {
							return nil, err
						}
						keep("ag xFull", xFull)
						keep("ag out", out)
						keep("ag dx", dx)
						keep("ag dw", dw)
						rs, err := s.NewMatmulReduceScatter(spec(overlap.KindMatmulReduceScatter))
						if err != nil {
							return nil, err
						}
						defer rs.Close()
						out2, dx2, dw2 := b.Zeros(dt, n, m), b.Zeros(dt, P*n, k), b.Zeros(dt, m, k)
						b.Copy(dw2, dw20)
						if err := rs.Forward(out2, x2, w2); err != nil {
							return nil, err
						}
						wk, err = rs.Backward(dx2, dw2, dout2, x2, w2)
						if err == nil {
							err = wk.Wait(nil)
						}
						if err != nil {
							return nil, err
						}
						keep("rs out", out2)
						keep("rs dx", dx2)
						keep("rs dw", dw2)
						return res, b.Sync()
					}
					ref, err := run(overlap.Collective{})
					if err != nil {
						return err
					}
					all := strategies.All(strategies.Options{StreamHooks: true})
					for _, s := range all[1:] {
						if s.Name() == "fused" && dt != tensor.BFloat16 {
							continue // the engine's operands are bf16 (TestEmuTPSuiteOnHybrid sees it refuse)
						}
						got, err := run(s)
						if err != nil {
							return fmt.Errorf("rank %d: %s: %w", r, s.Name(), err)
						}
						same := []string{"ag xFull", "ag out", "ag dw", "rs dx"}
						if s.Name() == "fused" {
							same = append(same, "rs dw")
						}
						for name, want := range ref {
							d, err := overlap.Compare(got[name], want)
							switch {
							case err != nil:
								return err
							case slices.Contains(same, name) && d.ULP != 0:
								return fmt.Errorf("rank %d: %s %s: %v from collective, expected its bits", r, s.Name(), name, d)
							case !(d.Rel <= overlaptest.Tolerance(dt)):
								return fmt.Errorf("rank %d: %s %s: %v from collective, expected ≤ %g", r, s.Name(), name, d, overlaptest.Tolerance(dt))
							}
						}
					}
					return nil
				})
			})
		}
	}
}

// A simulated cluster of two nodes, ranks {0, 1} and {2, 3}: the hybrid's
// placement on hosts (as launch gives it from the rendezvous) offers the
// emulated symmetric memory only inside a node, and no rank has a peer
// pointer to the other node's. On the grid tp 2 × dp 2, ep 4: the TP
// groups (inside a node) get pipelined and fused in their peer-copy forms,
// whose sites pass the conformance suite there; the EP group (and a site
// on a DP group) across the nodes keeps its collectives: a default or
// "auto" keeps collective and the summary (rank 0's start-up report) says
// why per site kind, naming the ranks of the other node; an explicit
// request is refused naming them.
func TestEmuTwoNodes(t *testing.T) {
	hybridRanks(t, 4, []int{0, 0, 1, 1}, func(w comm.Comm, b *cudabackend.Backend, _ *emuworld.Barrier) error {
		g, err := comm.NewGrid(w, 2, 2, 4)
		if err != nil {
			return err
		}
		defer g.Close()
		r := w.Rank()
		far, farDP := "group ranks 2, 3 (world ranks 2, 3) are", fmt.Sprintf("group rank 1 (world rank %d) is", r+2)
		if r >= 2 {
			far, farDP = "group ranks 0, 1 (world ranks 0, 1) are", fmt.Sprintf("group rank 0 (world rank %d) is", r-2)
		}
		all := strategies.All(strategies.Options{StreamHooks: true})
		spec := func(k overlap.Kind, name string, grp comm.Comm) overlap.Spec {
			return overlap.Spec{Kind: k, Name: name, Group: grp, Backend: b, Rows: 8, K: 16, Outs: []int{16}, DType: tensor.BFloat16, Experts: 8}
		}
		qkv := spec(overlap.KindAllGatherMatmul, "blocks.0.attn.qkv", g.TPGroup)
		proj := spec(overlap.KindMatmulReduceScatter, "blocks.0.attn.proj", g.TPGroup)
		moe := spec(overlap.KindExpert, "blocks.0.moe", g.EPGroup)
		dp := spec(overlap.KindMatmulReduceScatter, "dp.probe", g.DPGroup)

		// What each group can run.
		for _, sp := range []overlap.Spec{qkv, proj} {
			run, not := strategies.Available(sp, all)
			if len(run) != 3 {
				return fmt.Errorf("rank %d: %s site of the TP group %s (one node): runs %v (refused: %v), want collective, pipelined and fused", r, sp.Kind, sp.Group.Name(), run, not)
			}
			if how, sym := run[1].(overlap.Describer).Via(sp); !sym {
				return fmt.Errorf("rank %d: pipelined %s site inside a node moves by %q, want the peer-copy form", r, sp.Kind, how)
			}
		}
		run, not := strategies.Available(moe, all)
		if len(run) != 1 {
			return fmt.Errorf("rank %d: the expert site of the EP group across the nodes runs %v, want collective only", r, run)
		}
		for _, name := range []string{"pipelined", "fused"} {
			if err := not[name]; err == nil || !strings.Contains(err.Error(), "group ep[0 1 2 3] spans hosts: "+far+" not reachable by loads and stores") {
				return fmt.Errorf("rank %d: %s for the expert site across the nodes: %v, want a refusal naming %s", r, name, err, far)
			}
		}
		run, not = strategies.Available(dp, all)
		if len(run) != 2 || !strings.Contains(fmt.Sprint(not["fused"]), "spans hosts: "+farDP) {
			return fmt.Errorf("rank %d: a site of the DP group across the nodes runs %v, fused refused with %v; want collective and pipelined (exchanges), fused refused naming %s", r, run, not["fused"], farDP)
		}
		if how, sym := (strategies.Pipelined{}).Via(dp); sym || !strings.Contains(how, "exchanges") {
			return fmt.Errorf("rank %d: pipelined on the DP group across the nodes moves by %q, want exchanges on its collectives", r, how)
		}

		// The chooser, as cmd/train builds it: --overlap fused.
		ch, err := overlap.NewChooser(overlap.Config{Default: "fused"}, all, nil, overlap.WithTransports("nccl", "nvshmem"))
		if err != nil {
			return err
		}
		for _, sp := range []overlap.Spec{qkv, proj, moe} {
			if _, err := ch.Choose(sp); err != nil {
				return fmt.Errorf("rank %d: --overlap fused: %w", r, err)
			}
		}
		sum := strings.Join(ch.Summary(), "\n")
		for _, want := range []string{
			"all-gather-matmul: fused (1 site, the GEMM engine fed by copy-engine pulls from symmetric memory over nvshmem) as the default asks",
			"matmul-reduce-scatter: fused (1 site, the GEMM engine fed by copy-engine pulls from symmetric memory over nvshmem) as the default asks",
			"expert: collective (1 site, the group's collectives over nccl); fused for expert site \"blocks.0.moe\": group ep[0 1 2 3] spans hosts: " + far,
		} {
			if !strings.Contains(sum, want) {
				return fmt.Errorf("rank %d: summary\n%s\nwant %q", r, sum, want)
			}
		}
		ch, err = overlap.NewChooser(overlap.Config{Sites: map[string]string{"blocks.*.moe": "pipelined"}}, all, nil)
		if err != nil {
			return err
		}
		if _, err := ch.Choose(moe); err == nil || !strings.Contains(err.Error(), `sites["blocks.*.moe"] asks for pipelined`) || !strings.Contains(err.Error(), far) {
			return fmt.Errorf("rank %d: pipelined asked for the expert site across the nodes: %v, want a refusal naming %s", r, err, far)
		}

		// The TP groups' peer-copy sites run inside their node.
		for i, s := range all[1:] {
			rk := overlaptest.Rank{Group: g.TPGroup, Backend: b, Strategy: s, DType: tensor.BFloat16, Seed: uint64(71 + i)}
			skipped, err := rk.CheckAllReport()
			if err == nil {
				err = expectSkipped(s.Name(), tensor.BFloat16, skipped)
			}
			if err != nil {
				return fmt.Errorf("rank %d: %s on %s: %w", r, s.Name(), g.TPGroup.Name(), err)
			}
		}
		return b.Sync()
	})
}
