// Package worldsetup is what the New functions of the multi-process
// transports (comm/tcp, comm/nccl, comm/nvshmem) share to set up a world:
// its keys in the rendezvous store, and the checks of their arguments.
package worldsetup

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// seq numbers the worlds that each transport makes on each store client.
var seq sync.Map // key → *atomic.Int64

type key struct {
	transport string
	store     *rendezvous.Client
}

// Prefix returns the key prefix of the next world that transport makes on
// store: "asynctp/<transport>/<k>" for its k-th (from 1). The ranks agree on
// it as long as they make their worlds in the same order.
func Prefix(store *rendezvous.Client, transport string) string {
	v, _ := seq.LoadOrStore(key{transport, store}, new(atomic.Int64))
	return fmt.Sprintf("asynctp/%s/%d", transport, v.(*atomic.Int64).Add(1))
}

// CheckGPU checks the arguments of New of a GPU transport (pkg: "nccl",
// "nvshmem"): 0 ≤ rank < size, a CUDA ordinal, and a store to share the
// unique id unless the world has one rank.
func CheckGPU(pkg string, rank, size, device int, store *rendezvous.Client) error {
	switch {
	case size < 1 || rank < 0 || rank >= size:
		return fmt.Errorf("%s: New(rank %d, size %d): expected 0 ≤ rank < size", pkg, rank, size)
	case device < 0:
		return fmt.Errorf("%s: New(rank %d, size %d): device %d: expected a CUDA ordinal ≥ 0", pkg, rank, size, device)
	case store == nil && size > 1:
		return fmt.Errorf("%s: New(rank %d, size %d): expected a rendezvous store to share the unique id (nil is only for a world of one rank)", pkg, rank, size)
	}
	return nil
}
