// Command ablate runs the ablation of the overlap strategies on this
// machine and writes a report a person reads: every cell of a matrix
// (op × shape × world × transport × strategy) is verified against
// collective on the same inputs, then the strategies of each cell group
// are timed together in interleaved rounds; cells that cannot run here are
// listed with why. The report opens with the answer (per op and world
// size, the strategy to use and by how much, with its interval: another
// strategy only where it beats collective beyond the noise). It writes
// report.md, report.html (charts inline), results.json, PNG charts and an
// autotune cache that cmd/train --overlap auto --autotune-cache reads.
//
//	go run ./cmd/ablate --preset quick                 # every site of cmd/train's tiny models on the CPU (goroutine ranks over comm/local)
//	ablate --preset gpu --out $OUT                     # NVSHMEM PEs (child processes) and NCCL, under MPS if started
//	ablate --models llama-7b --m 2048,8192 --worlds 1,2,4 --transports nvshmem
//
// GPU cells and tcp cells run as child processes of this binary, one per
// rank (PE), a batch per (transport, world), meeting through a rendezvous
// store that rank 0 hosts: the child reads its batch from the file named
// by ASYNCTP_ABLATE_BATCH and prints its results on stdout. A tcp rank is
// a single-threaded CPU backend over comm/tcp, as a goroutine rank of
// local is over comm/local. When python3 can
// import torch with CUDA, bench/torch_ablate.py adds PyTorch rows at the
// same shapes (world size 1).
package main
