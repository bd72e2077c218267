// Package hybrid composes two transports into one group: every collective
// of the group runs on one (NCCL across the nodes of a cluster; comm/local
// or comm/tcp in tests), and the symmetric memory that the peer-copy
// pipelined and the fused strategies build on comes from the other
// (NVSHMEM's symmetric heap, bootstrapped through the same store; an
// emulation in tests), as PyTorch pairs its process groups with a symmetric
// memory rendezvous and DeepEP an NCCL group with an NVSHMEM buffer.
//
//	g, err := hybrid.New(ncclWorld, nvshmemWorld) // the same processes, the same ranks
//	tp, err := g.Split(color, key)                 // splits both: tp's collectives on NCCL, its symmetric memory NVSHMEM's
//
// Split splits both sides alike, so a group's symmetric memory addresses
// the same ranks as its collectives. Which peers a rank reaches by loads
// and stores is the symmetric side's (comm.LoadStore, comm.Unreachable),
// limited to the ranks of one host when the world's placement is given
// (WithHosts; launch gives the hosts it found at the rendezvous): a group
// that spans hosts has symmetric memory, but no peer pointers across them,
// and the strategies that need them refuse it by name.
//
// Ops follow comm's stream contract as the collective side does (a group's
// ops queue on the stream they are given); the symmetric side's own ops are
// not used. Close closes both; Abort aborts both.
package hybrid
