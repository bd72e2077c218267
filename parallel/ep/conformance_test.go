package ep_test

import (
	"testing"

	"github.com/asynctp/asynctp/parallel/ep"
	"github.com/asynctp/asynctp/parallel/ep/eptest"
)

// newDispatcher is the collective ExpertPath as the MoE layer builds it
// (ep.Parallel.TokenGroup, ep.Parallel.MaxTokens).
func newDispatcher(c eptest.Config) (ep.ExpertPath, error) {
	d, err := ep.NewDispatcher(c.Backend, c.Group, c.Experts, c.Stream)
	if err != nil {
		return nil, err
	}
	if err := d.SetTokenGroup(c.Tokens); err != nil {
		return nil, err
	}
	d.SetMaxTokens(c.MaxTokens)
	return d, nil
}

// TestConformance runs the ExpertPath conformance suite on the collective
// dispatcher: EP 1, 2, 3 and 4, synchronous and asynchronous transports,
// the token group twice the EP group, float64 and float32.
func TestConformance(t *testing.T) {
	eptest.RunLocal(t, newDispatcher, []int{1, 2, 3, 4})
}
