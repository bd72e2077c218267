package peerep

import (
	"errors"
	"strings"
	"testing"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// Where there is no symmetric memory or no CUDA backend, the expert path's
// pipelined strategy refuses with ErrUnavailable, saying why; the chooser
// then keeps collective for a default and fails an explicit request.
func TestPipelinedRefusesWithoutSymmetricMemory(t *testing.T) {
	err := local.Run(1, func(world comm.Comm) error {
		b := cpu.New()
		sp := overlap.Spec{Kind: overlap.KindExpert, Name: "blocks.0.moe", Group: world, Backend: b, Rows: 8, K: 4, Outs: []int{4}}
		if err := (Expert{}).Supports(sp); !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "expected the CUDA backend") {
			t.Errorf("Supports on the CPU: %v, want ErrUnavailable naming the backend", err)
		}
		if _, err := New(ep.ExpertConfig{Name: "moe", Backend: b, Group: world, Experts: 2, Cols: 4, MaxTokens: 8}); !errors.Is(err, overlap.ErrUnavailable) {
			t.Errorf("New on the CPU: %v, want ErrUnavailable", err)
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, []overlap.Strategy{pipelinedStrategy()}, nil)
		if err != nil {
			return err
		}
		if s, err := ch.Choose(sp); err != nil || s.Name() != "collective" {
			t.Errorf("default pipelined on the CPU: %v, %v, want collective", s, err)
		}
		ch, err = overlap.NewChooser(overlap.Config{Sites: map[string]string{"expert": "pipelined"}}, []overlap.Strategy{pipelinedStrategy()}, nil)
		if err != nil {
			return err
		}
		if _, err := ch.Choose(sp); err == nil || !strings.Contains(err.Error(), `sites["expert"] asks for pipelined`) {
			t.Errorf("explicit pipelined on the CPU: %v, want a refusal naming the key", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The fused strategy refuses the expert path like the pipelined one where
// there is no CUDA backend or symmetric memory, keeps collective as a
// default and fails an explicit request; Expert builds no TP site.
func TestFusedRefusesWithoutSymmetricMemory(t *testing.T) {
	err := local.Run(1, func(world comm.Comm) error {
		b := cpu.New()
		sp := overlap.Spec{Kind: overlap.KindExpert, Name: "blocks.0.moe", Group: world, Backend: b, Rows: 8, K: 4, Outs: []int{4}}
		tp := sp
		tp.Kind = overlap.KindAllGatherMatmul
		if err := (Expert{Fused: true}).Supports(tp); !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "the TP sites are overlap/peercopy's") {
			t.Errorf("Supports of a TP site: %v, want ErrUnavailable naming overlap/peercopy", err)
		}
		if err := (Expert{Fused: true}).Supports(sp); !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "fused: pipelined expert path") || !strings.Contains(err.Error(), "expected the CUDA backend") {
			t.Errorf("Supports on the CPU: %v, want ErrUnavailable naming the backend", err)
		}
		if _, err := (Expert{Fused: true}).NewExpertPath(ep.ExpertConfig{Name: "moe", Backend: b, Group: world, Experts: 2, Cols: 4, MaxTokens: 8}); !errors.Is(err, overlap.ErrUnavailable) {
			t.Errorf("NewExpertPath on the CPU: %v, want ErrUnavailable", err)
		}
		ch, err := overlap.NewChooser(overlap.Config{Default: "fused"}, []overlap.Strategy{fusedStrategy()}, nil)
		if err != nil {
			return err
		}
		if s, err := ch.Choose(sp); err != nil || s.Name() != "collective" {
			t.Errorf("default fused on the CPU: %v, %v, want collective", s, err)
		}
		ch, err = overlap.NewChooser(overlap.Config{Sites: map[string]string{"expert": "fused"}}, []overlap.Strategy{fusedStrategy()}, nil)
		if err != nil {
			return err
		}
		if _, err := ch.Choose(sp); err == nil || !strings.Contains(err.Error(), `sites["expert"] asks for fused`) {
			t.Errorf("explicit fused on the CPU: %v, want a refusal naming the key", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
