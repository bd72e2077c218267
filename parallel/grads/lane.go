package grads

import (
	"fmt"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/internal/lane"
	"github.com/asynctp/asynctp/tensor"
)

// newLane makes the reduction's lane (internal/lane): the buckets' sums
// run beside the backward, in the order they are started, on a GPU on the
// Reducer's side stream (queued after the backward's writes of the bucket
// on the backend's stream main), on the CPU on one goroutine per step,
// while the caller's goroutine goes on with the backward (the groups it
// sums over, DP and EDP, are not the ones the backward uses: comm.Comm
// allows different groups at once). A failed sum fails the ones after it
// in the step (their collectives would not match the peers').
func newLane(b tensor.Backend, main comm.Stream) (*lane.Lane, error) {
	l, err := lane.New(b, main, 256, "")
	if err != nil {
		return nil, fmt.Errorf("grads: the reduction's side stream: %w", err)
	}
	return l, nil
}

// closeLane releases a lane's side stream (once; nothing on the CPU, whose
// goroutine ends with each step). The lane must not be active.
func closeLane(l *lane.Lane) error {
	if err := l.Close(); err != nil {
		return fmt.Errorf("grads: the reduction's side stream: %w", err)
	}
	return nil
}
