package strategies_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/overlap"
	"github.com/asynctp/asynctp/overlap/strategies"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
)

// placed is the symmetric side of a simulated cluster: a group of a
// comm/local world whose memory is host memory (enough for the strategies
// to decide, not to run) and whose peer pointers exist only between ranks
// of one host (host[world rank]). It says nothing of what reaches what:
// the hybrid's placement on hosts (hybrid.WithHosts, as launch gives it
// from the rendezvous) decides.
type placed struct {
	comm.Comm
	host []int
}

func (p *placed) Unwrap() comm.Comm { return p.Comm }

func (p *placed) AllocSymmetric(shape []int, dt tensor.DType) (*tensor.Tensor, error) {
	return tensor.MustHost(dt, shape...), nil
}

func (p *placed) FreeSymmetric(*tensor.Tensor) error { return nil }

func (p *placed) PeerPtr(t *tensor.Tensor, r int) (uint64, error) {
	m, _ := comm.MembersOf(p.Comm)
	if p.host[m[r]] != p.host[m[p.Rank()]] {
		return 0, fmt.Errorf("rank %d is on another host", r)
	}
	return 0, errors.New("host memory has no device address")
}

func (p *placed) Split(color, key int) (comm.Comm, error) { return p.SplitNamed(color, key, "") }

func (p *placed) SplitNamed(color, key int, label string) (comm.Comm, error) {
	c, err := comm.SplitNamed(p.Comm, color, key, label)
	if err != nil || c == nil {
		return nil, err
	}
	return &placed{Comm: c, host: p.host}, nil
}

// twoNodes runs f on the ranks of a hybrid world of 4 over comm/local
// (collectives) and a placed symmetric side of hosts {0, 1} and {2, 3},
// with the grid tp 2 × dp 2 and ep 4: the TP groups inside a host, the DP
// and EP groups across the two.
func twoNodes(t *testing.T, f func(g *comm.Grid) error) {
	t.Helper()
	coll := local.NewWorld(4, local.WithTimeout(10*time.Second))
	sym := local.NewWorld(4, local.WithTimeout(10*time.Second))
	errs := make(chan error, 4)
	for r := range 4 {
		go func() {
			hosts := []int{0, 0, 1, 1}
			h, err := hybrid.New(coll[r], &placed{Comm: sym[r], host: hosts}, hybrid.WithHosts(hosts))
			if err != nil {
				errs <- err
				return
			}
			g, err := comm.NewGrid(h, 2, 2, 4)
			if err != nil {
				errs <- err
				return
			}
			defer g.Close()
			errs <- f(g)
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// On a simulated two-node placement the strategies built on symmetric
// memory are offered only to the groups inside a host: Available refuses
// them for the groups across hosts, naming the ranks it cannot reach; an
// explicit request is refused by the chooser, a default keeps collective
// and says why. The TP groups (inside a host) keep their symmetric memory:
// their pipelined sites would be the peer-copy form but for the CPU
// backend, which Available names.
func TestTwoNodePlacement(t *testing.T) {
	b := cpu.New(cpu.WithThreads(1))
	twoNodes(t, func(g *comm.Grid) error {
		r := g.World.Rank()
		ep := overlap.Spec{Kind: overlap.KindExpert, Name: "blocks.0.moe", Group: g.EPGroup, Backend: b, Rows: 8, K: 4, Outs: []int{4}, Experts: 4}
		run, not := strategies.Available(ep, nil)
		if len(run) != 1 || run[0].Name() != "collective" {
			return fmt.Errorf("rank %d: the expert site across hosts can run %v, want collective only", r, run)
		}
		far := fmt.Sprintf("group ranks 2, 3 (world ranks 2, 3) are not reachable by loads and stores from rank %d", r)
		if r >= 2 {
			far = fmt.Sprintf("group ranks 0, 1 (world ranks 0, 1) are not reachable by loads and stores from rank %d", r)
		}
		for _, name := range []string{"pipelined", "fused"} {
			err := not[name]
			if err == nil || !errors.Is(err, overlap.ErrUnavailable) || !strings.Contains(err.Error(), "group ep[0 1 2 3] spans hosts: "+far) {
				return fmt.Errorf("rank %d: %s for the expert site across hosts: %v, want ErrUnavailable naming %q", r, name, err, far)
			}
		}
		// The TP group (one host) passes the placement; the backend decides.
		tp := overlap.Spec{Kind: overlap.KindAllGatherMatmul, Name: "blocks.0.attn.qkv", Group: g.TPGroup, Backend: b, Rows: 4, K: 8, Outs: []int{8}, DType: tensor.Float32}
		run, not = strategies.Available(tp, nil)
		if len(run) != 2 || run[1].Name() != "pipelined" || not["fused"] == nil || !strings.Contains(not["fused"].Error(), "expected the CUDA backend") {
			return fmt.Errorf("rank %d: the TP site inside a host: runs %v, fused %v; want collective and pipelined (exchanges), fused refused for the CPU backend", r, run, not["fused"])
		}
		if how, sym := (strategies.Pipelined{}).Via(tp); sym || !strings.Contains(how, "exchanges") {
			return fmt.Errorf("rank %d: pipelined TP site on the CPU moves by %q (symmetric %v), want exchanges on the collectives", r, how, sym)
		}

		// The chooser: a default keeps collective and says why; an
		// explicit request is refused naming the unreachable ranks.
		ch, err := overlap.NewChooser(overlap.Config{Default: "pipelined"}, strategies.All(strategies.Options{}), nil, overlap.WithTransports("nccl", "nvshmem"))
		if err != nil {
			return err
		}
		if s, err := ch.Choose(ep); err != nil || s.Name() != "collective" {
			return fmt.Errorf("rank %d: default pipelined on the expert site across hosts: %v, %v; want collective", r, s, err)
		}
		if _, err := ch.Choose(tp); err != nil {
			return err
		}
		sum := strings.Join(ch.Summary(), "\n")
		for _, want := range []string{"all-gather-matmul: pipelined (1 site, exchanges on the group's collectives over nccl)",
			"expert: collective (1 site, the group's collectives over nccl); pipelined for expert site \"blocks.0.moe\": group ep[0 1 2 3] spans hosts: " + far} {
			if !strings.Contains(sum, want) {
				return fmt.Errorf("rank %d: summary\n%s\nwant %q", r, sum, want)
			}
		}
		ch, err = overlap.NewChooser(overlap.Config{Sites: map[string]string{"expert": "fused"}}, strategies.All(strategies.Options{}), nil)
		if err != nil {
			return err
		}
		if _, err := ch.Choose(ep); err == nil || !strings.Contains(err.Error(), `sites["expert"] asks for fused`) || !strings.Contains(err.Error(), far) {
			return fmt.Errorf("rank %d: fused asked for the expert site across hosts: %v, want a refusal naming %q", r, err, far)
		}
		return nil
	})
}
