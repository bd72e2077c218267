//go:build asynctp_emu

package peerep

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/internal/pes"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// The MoE benchmark's body on 2 emulated ranks at a tiny shape, bf16, for
// the pipelined path (the collective dispatcher's all-to-alls of device
// tensors have no emulated transport; the CPU test covers its timing):
// with the grouped GEMM it runs the device step, without it the host
// counts, and the line has a positive median.
func TestEmuMoEBenchBody(t *testing.T) {
	s := moeShape{E: 4, K: 2, C: 8, F: 8, N: 4}
	for _, grouped := range []bool{true, false} {
		t.Run(fmt.Sprintf("grouped=%v", grouped), func(t *testing.T) {
			reg := &registry{addrs: map[int][]uint64{}}
			bar := newBarrier(2)
			err := local.Run(2, func(world comm.Comm) error {
				b, err := cudabackend.NewEmulated(cudabackend.WithGroupedGEMM(grouped))
				if err != nil {
					return err
				}
				defer b.Close()
				c := &symComm{Comm: world, b: b, reg: reg, mine: map[uint64]int{}}
				lines, err := benchMoE(b, c, b.Stream(), s, tensor.BFloat16,
					[]overlap.Strategy{Pipelined{Options: []Option{WithBeforeWait(bar.wait)}}}, 1, 3, pes.WallTimer(b.Sync))
				if err != nil {
					return err
				}
				gemm, step := "grouped GEMM", "device step"
				if !grouped {
					gemm, step = "per-expert GEMMs", "host counts"
				}
				want := "(pipelined, " + gemm + ", " + step + ")"
				if len(lines) != 1 || !strings.Contains(lines[0], want) || strings.Contains(lines[0], " 0.0 µs") {
					return fmt.Errorf("rank %d: bench lines %q, want one with %q", c.Rank(), lines, want)
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
