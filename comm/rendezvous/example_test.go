package rendezvous_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/asynctp/asynctp/comm/rendezvous"
)

// Three ranks (goroutines here, processes in a real job) share rank 0's unique
// id through the store and meet at a barrier.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv, err := rendezvous.Serve(ctx, "127.0.0.1:0", "job-42") // rank 0 hosts the store
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	const world = 3
	got := make([]string, world)
	var wg sync.WaitGroup
	for rank := 0; rank < world; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := rendezvous.Dial(ctx, srv.Addr(), "job-42", rank, rendezvous.Options{})
			if err != nil {
				got[rank] = err.Error()
				return
			}
			defer c.Close()
			var uid []byte
			if rank == 0 {
				uid = []byte("opaque 128-byte unique id")
			}
			uid, err = c.BroadcastBytes(ctx, "nccl/uid", rank, 0, uid)
			if err == nil {
				err = c.Barrier(ctx, "after-uid", world)
			}
			got[rank] = fmt.Sprintf("rank %d: %q %v", rank, uid, err)
		}()
	}
	wg.Wait()
	for _, line := range got {
		fmt.Println(line)
	}
	// Output:
	// rank 0: "opaque 128-byte unique id" <nil>
	// rank 1: "opaque 128-byte unique id" <nil>
	// rank 2: "opaque 128-byte unique id" <nil>
}

func ExampleFromEnv() {
	env := map[string]string{ // what srun gives task 5 of 8 on the second node
		"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
		"SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "4242",
		"MASTER_PORT": "29500",
	}
	info, err := rendezvous.FromEnv(func(k string) string { return env[k] })
	fmt.Println(info, err)
	// Output:
	// rank 5/8 (local 1/4), store gpu007:29500, job "4242", from slurm <nil>
}

func ExampleExpandNodeList() {
	hosts, err := rendezvous.ExpandNodeList("gpu[001-003,010],login1")
	fmt.Println(hosts, err)
	// Output:
	// [gpu001 gpu002 gpu003 gpu010 login1] <nil>
}
