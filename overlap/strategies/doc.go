// Package strategies is the registry of the overlap strategies: one name,
// one type, for every site kind, and the one function (Available) that
// programs and library users ask what a site's group and backend can run.
//
//	name         type                 where it runs
//	collective   overlap.Collective   everywhere: the reference
//	pipelined    strategies.Pipelined everywhere for the TP sites; the expert path on symmetric memory
//	fused        strategies.Fused     symmetric memory with peer pointers, the CUDA backend, the GEMM engines
//
// Each type's doc comment holds its table (site kind → forward, backward,
// transfer, requirements). Pipelined and Fused pick their implementation
// per site from what the site's group and backend offer, never from a
// transport's name: the peer-copy forms (overlap/peercopy's Chunked and
// Engine for the TP sites, parallel/ep/peerep's Expert for the expert
// path) on a group with symmetric memory
// (comm.SymmetricMemory) whose ranks all reach each other by loads and
// stores (comm.Unreachable) and the CUDA backend on a stream; the exchange
// form (overlap.Exchange) elsewhere. The implementations are
// overlap.Builders without a name: no other type answers "pipelined" or
// "fused". A group that spans hosts (an EP or DP
// group across nodes) has no peer pointers between them: a site that needs
// them is refused, naming the group and the ranks it cannot reach, and a
// default or "auto" keeps it on collective, saying so (overlap.Chooser).
//
// Why a package of its own: the implementations import overlap (the Spec,
// the Strategy contract, the exchange schedule), and parallel/ep/peerep
// imports overlap/peercopy, so a type in overlap that chose between them
// would need them to register themselves (global state set by an import's
// side effect: a program that forgot the import would silently run another
// implementation). This package sits above all of them and imports them
// plainly; nothing below cmd/, ablate/ and train-level code imports it
// (parallel/model takes a Chooser).
package strategies
