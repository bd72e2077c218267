//go:build asynctp_emu

package emuworld

import (
	"time"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/hybrid"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor/cudabackend"
)

// HybridRanks runs f on P goroutine ranks, each with its own emulated
// backend (made with opts and kept by reg, which the caller closes) and a
// comm/hybrid group of two worlds: the collectives of one comm/local world
// staged through the host (Staged), the symmetric memory of another (Sym
// over reg; hosts, when not nil, places the ranks on hosts, and the hybrid
// offers symmetric memory inside a host only). bar is the ranks' barrier
// before each wait. It returns the first rank's error.
func HybridRanks(P int, reg *Registry, hosts []int, opts []cudabackend.Option, f func(g comm.Comm, b *cudabackend.Backend, bar *Barrier) error) error {
	coll := local.NewWorld(P, local.WithTimeout(120*time.Second))
	bar := NewBarrier(P)
	var hopts []hybrid.Option
	if hosts != nil {
		hopts = append(hopts, hybrid.WithHosts(hosts))
	}
	return local.Run(P, func(sym comm.Comm) error {
		b, err := cudabackend.NewEmulated(opts...)
		if err != nil {
			return err
		}
		reg.Keep(b)
		g, err := hybrid.New(Staged{Comm: coll[sym.Rank()], B: b}, NewSym(sym, b, reg, hosts), hopts...)
		if err != nil {
			return err
		}
		return f(g, b, bar)
	}, local.WithTimeout(120*time.Second))
}
