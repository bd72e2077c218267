package main

import (
	"fmt"
	"math"

	"github.com/asynctp/asynctp/parallel/grads"
	"github.com/asynctp/asynctp/tensor"
)

// The values of --grad-reduce-dtype.
const (
	ReduceFP32 = "fp32" // the default: fp32 main gradients summed in fp32
	ReduceBF16 = "bf16" // a bf16 model's main gradients rounded to bf16 for the sum
)

// checkAccum checks the fields of gradient accumulation and of the
// reduction against the resolved layout: the batch splits into
// micro-batches of every replica and the reduction's fields take values
// it knows (effect.go refuses them for a run that sums nothing).
func (c *Config) checkAccum() error {
	p := c.Parallel
	if _, err := c.Train.MicroBatches(p.DP); err != nil {
		return fmt.Errorf("--batch %d is not --micro-batch %d × accumulation steps × --dp %d: expected a batch divisible by micro-batch × dp = %d",
			c.Train.Batch, c.Train.MicroBatch, p.DP, c.Train.MicroBatch*p.DP)
	}
	switch p.GradReduceDType {
	case "", ReduceFP32, ReduceBF16:
	default:
		return fmt.Errorf("--grad-reduce-dtype %q, expected %s or %s", p.GradReduceDType, ReduceFP32, ReduceBF16)
	}
	if !(p.GradBucketMB >= 0) || math.IsInf(p.GradBucketMB, 0) || p.GradBucketMB*(1<<20) > math.MaxInt32 {
		return fmt.Errorf("--grad-bucket-mb %v, expected a size in MiB > 0 and below 2048 (0: 25)", p.GradBucketMB)
	}
	if p.GradReduceDType == ReduceBF16 && c.Device == "cpu" {
		return fmt.Errorf("--grad-reduce-dtype bf16: expected a bf16 model (--device cuda); the CPU trains f32 models, whose gradients are summed in f32")
	}
	return nil
}

// orFP32 is the reduction dtype s, "" being fp32.
func orFP32(s string) string {
	if s == "" {
		return ReduceFP32
	}
	return s
}

// gradReduce is the model's grads.Config for the run's parameters of
// dtype dt.
func (c *Config) gradReduce(dt tensor.DType) (grads.Config, error) {
	p := c.Parallel
	gc := grads.Config{AfterBackward: p.OverlapGradReduce != nil && !*p.OverlapGradReduce}
	if p.GradBucketMB > 0 {
		gc.BucketBytes = max(int(p.GradBucketMB*(1<<20)), 1)
	}
	if p.GradReduceDType == ReduceBF16 {
		if dt != tensor.BFloat16 {
			return gc, fmt.Errorf("--grad-reduce-dtype bf16: expected a bf16 model (--device cuda), found %v parameters, whose gradients are summed in their own dtype", dt)
		}
		gc.DType = tensor.BFloat16
	}
	return gc, nil
}
