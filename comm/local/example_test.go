package local_test

import (
	"fmt"
	"sync"

	"github.com/asynctp/asynctp/comm"
	"github.com/asynctp/asynctp/comm/local"
	"github.com/asynctp/asynctp/tensor"
)

// Four ranks, one goroutine each, sum a vector.
func Example() {
	ranks := local.NewWorld(4)
	results := make([][]float32, len(ranks))
	var wg sync.WaitGroup
	for r, c := range ranks {
		wg.Go(func() {
			buf, _ := tensor.FromFloat32([]float32{float32(r), 1}, 2)
			w, err := c.AllReduce(buf, comm.Sum, nil) // nil: the default stream
			if err == nil {
				err = w.Wait(nil)
			}
			if err != nil {
				panic(err)
			}
			results[r] = buf.F32()
		})
	}
	wg.Wait()
	fmt.Println(results[0], results[3])
	// Output: [6 4] [6 4]
}

// Run drives the ranks and turns a failure of one into errors for all.
func ExampleRun() {
	err := local.Run(2, func(c comm.Comm) error {
		tp, err := c.Split(0, c.Rank())
		if err != nil {
			return err
		}
		defer tp.Close()
		src, _ := tensor.FromFloat32([]float32{float32(10 * c.Rank())}, 1)
		dst := tensor.MustHost(tensor.Float32, 2)
		w, err := tp.AllGather(dst, src, nil)
		if err != nil {
			return err
		}
		if err := w.Wait(nil); err != nil {
			return err
		}
		if c.Rank() == 0 {
			fmt.Println(tp.Name(), dst.F32())
		}
		return nil
	})
	fmt.Println(err)
	// Output:
	// world/0[0 1] [0 10]
	// <nil>
}
