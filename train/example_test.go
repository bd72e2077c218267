package train_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/asynctp/asynctp/layers"
	"github.com/asynctp/asynctp/tensor"
	"github.com/asynctp/asynctp/tensor/cpu"
	"github.com/asynctp/asynctp/tokens"
	"github.com/asynctp/asynctp/train"
)

func ExampleConfig_Schedule() {
	cfg := train.Config{Steps: 100, LR: 1e-3, MinLR: 1e-4, Warmup: 10}
	for _, step := range []int{1, 10, 55, 100} {
		fmt.Printf("step %3d: lr %.2e\n", step, cfg.Schedule().LR(step))
	}
	// Output:
	// step   1: lr 1.00e-04
	// step  10: lr 1.00e-03
	// step  55: lr 5.50e-04
	// step 100: lr 1.00e-04
}

func ExampleRun() {
	out, err := os.MkdirTemp("", "train-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(out)

	b := cpu.New()
	model, err := layers.NewGPT(b, layers.GPTConfig{Layers: 1, Dim: 16, Heads: 2, Vocab: 256, Seq: 16, Seed: 1}, tensor.Float32)
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := train.Config{Steps: 4, Batch: 2, Seq: 16, LR: 1e-3, Warmup: 1, Seed: 7, OutDir: out}
	ds := tokens.FromBytes("example", bytes.Repeat([]byte("hello, world. "), 20))
	data, err := train.NewLoader(ds, train.LoaderConfig{Batch: cfg.Batch, Seq: cfg.Seq, Vocab: 256, Seed: cfg.Seed})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := train.Run(context.Background(), b, model, data, cfg, train.WithOutput(&bytes.Buffer{}))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("steps:", res.StepsRun, "checkpoint:", filepath.Base(res.LastCheckpoint))
	// Output:
	// steps: 4 checkpoint: step-000004
}
