// Package hostreduce is the one round trip of a few host values through a
// collective: upload them to a small device buffer, all-reduce it over a
// group on a stream, wait, and download the result (AllReduce). The
// training code uses it for the handful of scalars that are needed on the
// host anyway (the gradient norm's partial sums, the router statistics,
// the resume step, the interrupt flag); the loss and per-row tensors stay
// on the device.
//
// It sits beside comm, importing comm and tensor, so that comm itself
// knows nothing of a tensor.Backend.
package hostreduce
