// Package ep is expert parallelism: the mixture-of-experts layer of
// layers.MoE with its experts spread over the ranks of an EP group, and the
// dispatch/combine protocol (DeepEP's) that moves the tokens to their
// experts and back.
//
// # Layout
//
// An EP group of P ranks (a comm.Comm; comm.Grid's EPGroup) shares one MoE
// layer of E experts, E divisible by P: rank r holds experts
// [r·E/P, (r+1)·E/P) (its w_gate, w_up, w_down are that slice of the stacked
// (E, ...) weights, under the unsharded names, initialised by
// layers.ShardInit to exactly the unsharded values). The router (E, C) is
// replicated. Each rank brings its own tokens (N_r, C): the layer over the
// group equals layers.MoE over the concatenation of the ranks' tokens in
// rank order — outputs, auxiliary loss, statistics, and the gradients once
// the router's are summed over the group (the tests check EP 1, 2, 4 within
// 1e-5 in float32).
//
// # The protocol
//
//	rank r (its tokens)                            the ranks that hold the experts
//	───────────────────                            ───────────────────────────────
//	x (N_r, C) ─ router ─► idx, weights (N_r, K)
//	     │
//	Layout(idx)            counts per expert and per rank (host, no communication)
//	     │
//	Dispatch(x, layout)    1. all-gather of the counts (P, E+1); the host waits
//	     │                 2. capacity and drops, in group token order
//	     │                 3. gather x into expert order = rank order (M_send, C)
//	     │                 4. all-to-all of the rows  ───────►  recv (M_recv, C), by source
//	     │                    returns (recv, Handle, Work)        then expert; Wait first
//	     │                                                        SortByExpert
//	     │                                                        experts: one GEMM per expert
//	     │                                                        UnsortByExpert
//	Combine(out, y, weights, h)  ◄─── reverse all-to-all ───────  y (M_recv, C)
//	     out[n] = Σ_j weights[n, j]·y[row of slot (n, j)]
//
// and the backward twins, in reverse:
//
//	CombineBackward(dweights, dout, weights, h) → (dy, Work): the combine's
//	    gradient rows, all-to-all to the experts' ranks; dweights (N, K)
//	    feeds the router's backward.
//	DispatchBackward(dx, drecv, h): the received rows' gradients, all-to-all
//	    back, summed per token into dx.
//
// The Handle keeps what they need: the counts exchanged, the local
// RoutingPlan (slot → sent row), the permutations and the rows Combine got
// back (for dweights). Release gives its buffers back.
//
// # The async contract
//
// Every call says what it waits for. Layout communicates nothing. Dispatch
// waits on the host for the count exchange (the host sizes the buffers and
// the GEMMs from it, as DeepEP's non-cached mode does), queues the
// permutation on the backend, issues the row all-to-all and returns its
// Work without waiting: the caller waits (Work.Wait on its stream) before
// reading the received rows, and can overlap other work (the MoE layer
// all-reduces the router statistics meanwhile). CombineBackward returns the
// Work of its all-to-all the same way. Combine and DispatchBackward end in
// a reduction that consumes their all-to-all: they wait for it on the
// stream (no host synchronisation on a GPU) and queue the reduction after
// it. All collectives are over the EP group, in the same order on every
// rank; every rank calls Forward and Backward, even one that receives no
// row (its expert GEMMs are then empty).
//
// # Capacity and drops
//
// With a capacity factor, capacity = ceil(CF·T·K/E) for the T tokens of the
// whole group (from the count exchange), and each expert keeps its first
// capacity slots in group token order: rank 0's tokens, then rank 1's...
// Every rank derives every rank's kept counts from the exchanged counts, so
// the drops need no second exchange and match the single-rank layer.
//
// # Auxiliary losses under EP
//
// The load-balancing loss E·Σ_e f_e·P_e and the z-loss (1/T)·Σ lse² are
// over all T tokens of the group: f_e from the exchanged counts, P_e and
// Σ lse² from an all-reduce of each rank's sums (E+1 values). AuxLoss is
// the same on every rank. Its gradient with respect to the router
// probabilities of a token n on rank r is coef·E·f_e/T (and 2·zcoef·lse_n/T
// through the logits): each rank adds it for its own tokens, so the sum of
// the ranks' router gradients is the gradient of the one AuxLoss of the
// group — the rule of the single-rank layer over the union of the tokens.
//
// # The token group
//
// By default the step's tokens are those of the EP group: the auxiliary
// losses, the statistics and the capacity are over them. In a larger grid
// the ranks of several EP groups may all bring different tokens of one
// batch (the sharded model splits the batch over every world rank in its
// MoE blocks); Parallel.TokenGroup (Dispatcher.SetTokenGroup) names that wider
// group — comm.Grid's World, whose runs of P consecutive ranks are the EP
// groups. The count exchange then all-gathers over the token group, so the
// capacity, the drops (in token-group rank order), the counts and, through
// an all-reduce over it, the probability sums and Σ lse² are those of every
// token of the step; the rows still move within the EP group. The layer
// over the token group then equals layers.MoE over all of its tokens.
//
// # Gradient reduction in a larger grid (for the sharded model)
//
// Shards (or ReplicatedParams and ExpertParams) tells them apart, and
// parallel/grads reduces them by it:
//
//   - The router weight (replicated) is replicated on every rank; its
//     gradient covers the rank's own tokens. Reduce it like a dense weight
//     whose copies saw different tokens: every rank that holds a copy and
//     saw other tokens, the EP group included. With TP = 1 that is
//     comm.Grid's DP group (the world, which contains the EP groups); with
//     TP > 1, when the TP ranks hold different tokens (sequence
//     parallelism, or a split of the replicated tokens before the layer),
//     the DP and the TP groups (as for the norm weights under sequence
//     parallelism) — the token group.
//   - The expert weights (split over EP) already hold the gradient of every
//     token of the EP group routed to them. Reduce them over the ranks that
//     hold the same experts in other EP groups (comm.Grid's EDP group),
//     never over the EP group.
//   - Use the same operation (sum, or average by the same count D) for
//     both. The CE gradient and the expert/router parts scale together;
//     only the aux term does not: it is one loss per token group, not one
//     per rank. With sums (the objective Σ_ranks L_r + AuxLoss), the default
//     is exact. If every rank adds AuxLoss to its own loss and gradients are
//     averaged, the aux term would be weighted 1/P too little: construct the
//     layer with Parallel.AuxGradScale = P (P = the token group's size: the EP group's
//     unless Parallel.TokenGroup widened it).
//
// # Shadow mode
//
// An expert path whose strategy is not collective, under a chooser with a
// shadow (overlap.WithShadow), is wrapped in a decorator (shadow.go) that
// runs the collective Dispatcher beside it on the sampled steps, from the
// same tokens and routing (the same capacity and drops) and the real
// path's expert outputs and gradients, and compares the dispatched rows,
// the combined output, the combine backward's rows, the token gradients
// and dweights; it keeps the path's DeviceOffsets and FusedOffsets, so
// the layer takes the same step.
//
// Each rank must bring different tokens: under tensor parallelism without
// sequence parallelism the ranks of a TP group hold the same tokens, so an
// EP group drawn from a TP group must first split them (each rank takes
// N/P rows, as sequence parallelism does) and all-gather the outputs.
package ep
