// Package lane runs communication beside the math, in issue order: the
// lane of an overlap site (overlap's pipelined exchanges) and of the
// gradient reduction (parallel/grads' bucket sums and the distributed
// optimizer's all-gathers). It is internal: a program uses the sites and
// the reducer, not their lanes.
//
//   - On a GPU backend (tensor.Streams) ops run on the lane's own side
//     stream: each is queued after the work already queued on the main
//     stream (an event, no host sync), and waiting for its Work orders the
//     main stream after it.
//   - On the CPU ops run on one goroutine per call (Begin to End), one
//     after another in the order they were issued, while the caller's
//     goroutine goes on with the math; every rank issues its collectives
//     in the same order. A failed op fails the ones after it in the call
//     (their collectives would not match the peers').
package lane
