//go:build asynctp_emu

package peerep

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/testing/emuworld"
	"github.com/asynctp/asynctp/internal/testing/pes"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The MoE benchmark's body on 2 emulated ranks at a tiny shape, bf16, for
// the pipelined path (the collective dispatcher's all-to-alls of device
// tensors go through host copies here; the CPU test covers its timing):
// with the grouped GEMM it runs the device step, without it the host
// counts, and the line has a positive median.
func TestEmuMoEBenchBody(t *testing.T) {
	s := moeShape{E: 4, K: 2, C: 8, F: 8, N: 4}
	for _, grouped := range []bool{true, false} {
		t.Run(fmt.Sprintf("grouped=%v", grouped), func(t *testing.T) {
			reg := emuworld.NewRegistry()
			defer reg.CloseAll(t)
			bar := emuworld.NewBarrier(2)
			err := local.Run(2, func(world comm.Comm) error {
				b, err := cudabackend.NewEmulated(cudabackend.WithGroupedGEMM(grouped))
				if err != nil {
					return err
				}
				reg.Keep(b)
				c := newSymComm(world, b, reg)
				lines, err := benchMoE(b, c, b.Stream(), s, tensor.BFloat16,
					[]overlap.Strategy{pipelinedStrategy(WithBeforeWait(bar.Wait))}, 1, 3, pes.WallTimer(b.Sync), true)
				if err != nil {
					return err
				}
				gemm, step := "grouped GEMM", "device step"
				if !grouped {
					gemm, step = "per-expert GEMMs", "host counts"
				}
				want := "(pipelined, " + gemm + ", " + step + ")"
				if len(lines) < 1 || !strings.HasPrefix(lines[0], "bench: ") || !strings.Contains(lines[0], want) || strings.Contains(lines[0], " 0.0 µs") {
					return fmt.Errorf("rank %d: bench lines %q, want one with %q first", c.Rank(), lines, want)
				}
				// The phase lines: every phase of the step, each marked once
				// per step (3 steps), the expert GEMMs' own on the grouped
				// GEMM only.
				phases := map[string]string{}
				for _, l := range lines[1:] {
					f := strings.Fields(l)
					if f[0] != "bench-phase:" {
						return fmt.Errorf("rank %d: line %q after the bench line, want bench-phase lines", c.Rank(), l)
					}
					phases[f[len(f)-5]] = f[len(f)-2]
				}
				wantPhases := []string{"(start)", "moe.route", "moe.dispatch", "moe.combine", "moe.bwd.combine", "moe.bwd.dispatch", "moe.bwd.route", "other"}
				if grouped {
					wantPhases = append(wantPhases, "moe.stats", "moe.experts.gate", "moe.experts.down", "moe.experts.bwd.dh", "moe.experts.bwd.dx")
				} else {
					wantPhases = append(wantPhases, "moe.experts", "moe.bwd.experts")
				}
				for _, p := range wantPhases {
					if _, ok := phases[p]; !ok {
						return fmt.Errorf("rank %d: no phase %s in %v", c.Rank(), p, phases)
					}
				}
				if n := phases["moe.route"]; n != "(3" {
					return fmt.Errorf("rank %d: moe.route marked %s times, want (3 marks)", c.Rank(), n)
				}
				if c.Rank() == 0 {
					t.Log(strings.Join(lines, "\n"))
				}
				return nil
			}, local.WithTimeout(2*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
