package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/model"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// --grouped-gemm: the form of the MoE layers' expert GEMMs.
//
//   - auto (the default): the backend's own preference for the layer's
//     local experts (tensor.UseGroupedFor): the CPU takes its grouped op;
//     the CUDA backend takes its grouped GEMM for layers of at least
//     cudabackend.GroupedAutoMinExperts local experts on Hopper.
//   - on: the backend's grouped GEMM (cudabackend.WithGroupedGEMM(true) on
//     the GPU): one grouped call per projection for all local experts, and,
//     with an expert path that has ep.DeviceOffsets (--overlap pipelined on
//     --comm nvshmem GPUs), the device step that reads no counts back to the
//     host. On the CPU the grouped op is already the default: on is auto.
//   - off: one GEMM per expert on row views (cudabackend.WithGroupedGEMM(false);
//     on the CPU its grouped op is declined, perExpertCPU), so the
//     expert path runs on host counts.
//
// on and off are refused for a model without MoE blocks, where they would
// change nothing.
const (
	GroupedAuto = "auto"
	GroupedOn   = "on"
	GroupedOff  = "off"
)

var groupedModes = []string{GroupedAuto, GroupedOn, GroupedOff}

// checkGrouped validates cfg.GroupedGEMM ("" is auto, written back) and,
// once the model is known, refuses on or off for a dense model.
func (c *Config) checkGrouped() error {
	if c.GroupedGEMM == "" {
		c.GroupedGEMM = GroupedAuto
	}
	if !slices.Contains(groupedModes, c.GroupedGEMM) {
		return fmt.Errorf("--grouped-gemm %q: expected one of %s", c.GroupedGEMM, strings.Join(groupedModes, ", "))
	}
	if c.GroupedGEMM != GroupedAuto && c.modelKnown() && c.Model.Experts == 0 {
		return fmt.Errorf("--grouped-gemm %s: the model has no MoE blocks (experts 0), so it would change nothing; expected auto (or unset), or --experts", c.GroupedGEMM)
	}
	if c.DumpRouting != "" && c.modelKnown() && c.Model.Experts == 0 {
		return fmt.Errorf("--dump-routing %s: the model has no MoE blocks (experts 0), so there is no routing to dump; expected --experts", c.DumpRouting)
	}
	return nil
}

// groupedCUDA is the CUDA backend's option of mode (none for auto).
func groupedCUDA(mode string) []cudabackend.Option {
	switch mode {
	case GroupedOn:
		return []cudabackend.Option{cudabackend.WithGroupedGEMM(true)}
	case GroupedOff:
		return []cudabackend.Option{cudabackend.WithGroupedGEMM(false)}
	}
	return nil
}

// perExpertCPU is the CPU backend declining its grouped GEMM
// (--grouped-gemm off): layers.Experts then runs one MatMul per expert. Every
// other method, and every optional interface, is the CPU backend's.
type perExpertCPU struct{ *cpu.Backend }

// PreferGrouped implements tensor.GroupedPreference.
func (*perExpertCPU) PreferGrouped() bool { return false }

// cpuGrouped applies mode to a CPU backend b: off wraps it in perExpertCPU;
// auto and on leave it as it is (its grouped op is taken).
func cpuGrouped(b tensor.Backend, mode string) (tensor.Backend, error) {
	if mode != GroupedOff {
		return b, nil
	}
	c, ok := b.(*cpu.Backend)
	if !ok {
		return nil, fmt.Errorf("--grouped-gemm off: backend %T: expected the CPU or the CUDA backend", b)
	}
	return &perExpertCPU{c}, nil
}

// moeGEMMs is what the header says of one MoE layer.
type moeGEMMs struct {
	grouped, device, deviceOffsets bool
	single                         bool // layers.MoE, the single-rank layer
}

// gptGEMMs describes the MoE layers of the single-rank model.
func gptGEMMs(m *layers.GPT) []moeGEMMs {
	var out []moeGEMMs
	for _, blk := range m.Blocks {
		if blk.MoE != nil {
			out = append(out, moeGEMMs{grouped: blk.MoE.Experts.Grouped(), single: true})
		}
	}
	return out
}

// shardedGEMMs describes the MoE layers of a rank's sharded model.
func shardedGEMMs(m *model.Model) []moeGEMMs {
	var out []moeGEMMs
	for _, blk := range m.Blocks {
		if mb, ok := blk.(*model.MoEBlock); ok {
			_, dev := mb.MoE.Dispatch.(ep.DeviceOffsets)
			out = append(out, moeGEMMs{grouped: mb.MoE.Experts.Grouped(), device: mb.MoE.DeviceStep(), deviceOffsets: dev})
		}
	}
	return out
}

// expertGEMMLine is the header's line on the expert GEMMs of the MoE
// layers ls under --grouped-gemm mode, on the backend named backend:
// grouped or one per expert, and whether the step reads the routing's
// counts on the host, with why.
func expertGEMMLine(mode, backend string, ls []moeGEMMs) string {
	n, grouped, device, offsets, single := len(ls), 0, 0, 0, 0
	for _, l := range ls {
		if l.grouped {
			grouped++
		}
		if l.device {
			device++
		}
		if l.deviceOffsets {
			offsets++
		}
		if l.single {
			single++
		}
	}
	how := "auto: the backend's preference"
	if mode != GroupedAuto {
		how = "--grouped-gemm " + mode
	}
	var s string
	switch grouped {
	case n:
		s = fmt.Sprintf("grouped (%s's grouped GEMM, one call per projection for all local experts; %s)", backend, how)
	case 0:
		s = fmt.Sprintf("one GEMM per expert (%s)", how)
	default:
		s = fmt.Sprintf("grouped in %d of %d MoE layers (%s)", grouped, n, how)
	}
	switch {
	case device == n:
		return s + "; device step: routing, counts and expert offsets stay on the device (no host read of counts)"
	case device > 0:
		return s + fmt.Sprintf("; device step in %d of %d MoE layers, host counts in the others", device, n)
	case offsets > 0:
		return s + "; host counts: the pipelined expert path's device step needs the grouped GEMM (--grouped-gemm on)"
	case single > 0:
		return s + "; host counts: the single-rank MoE layer plans its routing on the host (the device step is the EP layer's: --comm nvshmem --overlap pipelined on GPUs, one process is enough)"
	}
	return s + "; host counts: the expert path has no device offsets (the device step needs --overlap pipelined on --comm nvshmem GPUs)"
}
