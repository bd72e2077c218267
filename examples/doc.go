// Package examples holds programs that use asynctp as a library, each a
// command of its own that checks its result and exits with status 1 when
// a number is wrong:
//
//	quickstart      the shortest program: a linear layer fit with AdamW (README)
//	tensorparallel  a custom model trained at TP 2 on goroutine ranks, equal to one rank
//	expertparallel  an MoE layer at EP 2, equal to the layer on one rank
//	overlapsites    a strategy per communication site, equal to all collective
//	saveload        weights saved per rank, merged, loaded into another layout
//	trainloop       a training loop of one's own with the optimizer and schedule
//
// Run one with go run ./examples/tensorparallel; go test ./examples builds
// and runs them all.
package examples
