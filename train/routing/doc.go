// Package routing is the routing dump of a training run and its
// comparison: for every training step and MoE layer, each token's top-k
// experts, so that two runs — one process against EP 2 × DP 2, the CPU
// against the GPU — can be compared token by token (cmd/train's
// --dump-routing DIR and train routing-diff DIR1 DIR2).
//
// Each rank writes DIR/rank-NNNNN.routing (its world rank, File): a
// 16-byte magic, then one record per step and MoE layer, little-endian:
//
//	u32 step, u32 layer (the MoE layers' ordinal, 0 first), u32 rank, u32 ranks
//	(the layer's token group: the rank's place in it, and its size), u32 tokens,
//	u32 topk, u16 name length, the name, tokens·topk u16 expert ids
//	(row-major, the router's order)
//
// The token group's ranks route consecutive slices of the step's tokens
// in rank order (parallel/model: every world rank its own slice of the
// global batch), so the slices of ranks 0..ranks−1 concatenated are the
// step's tokens in the global order, the single-rank run's. A new run
// truncates the files; a resumed run appends to them, and the later
// record of a step replaces the earlier (a resume repeats the steps after
// its checkpoint) when Read assembles a dump.
package routing
