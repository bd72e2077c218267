// Package rendezvous is how the processes of one training job find each other:
// it reads the launcher's environment (FromEnv) and runs a small TCP key-value
// store through which ranks exchange opaque byte strings, such as the NCCL and
// NVSHMEM unique ids, and meet at barriers. No MPI or PMI is needed.
//
// # Environment
//
// FromEnv recognises, in this order of precedence, the variables of
// asynctp's own launcher (ASYNCTP_RANK, ASYNCTP_WORLD_SIZE, ...), torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, ...), SLURM's srun (SLURM_PROCID,
// SLURM_NTASKS, ...) and Open MPI's mpirun (OMPI_COMM_WORLD_RANK, ...). When
// none is set the process is rank 0 of a world of 1 (Source "single"). Under
// SLURM the master address, unless MASTER_ADDR is set, is the first host of
// the step's (or job's) node list; see ExpandNodeList for the compressed form
// ("gpu[001-004,007],login1"), and the port, unless MASTER_PORT is set, is
// derived from the job id so that every rank computes the same one.
//
// # The store
//
// Rank 0 hosts a Server (Serve); every rank, rank 0 included, connects a
// Client (Dial, or Join which does both). Values are byte strings of at most
// MaxValueSize bytes under keys of at most MaxKeySize bytes. Keys are never
// deleted; Set overwrites. Get and Wait block until their keys exist; Add is an
// atomic counter whose value is stored as a decimal string; Barrier and
// BroadcastBytes are built from these. Every call takes a context; a context
// without a deadline gets Options.Timeout, so no call waits forever. A server
// that goes away fails the pending calls of its clients with
// ErrConnectionLost.
//
// # Wire protocol
//
// One TCP connection per client carries frames in both directions. A frame is
// a 4-byte big-endian body length followed by the body. Bodies longer than
// MaxValueSize+64 KiB (64 KiB until the hello is accepted), or with more than
// 65536 fields, are rejected before they are allocated, and the connection is
// dropped. A body is
//
//	request:  op (1 byte) | request id (8 bytes, big-endian) | field*
//	response: status (1)  | request id (8)                   | field*
//	field:    length (4 bytes, big-endian) | bytes
//
// Requests are answered out of order (a blocking Get does not hold up a Set
// sent after it), matched to their callers by request id. The ops and their
// fields are:
//
//	hello  (id 0): "asynctp-rendezvous", protocol version, job id, rank
//	set:    key, value                  -> (nothing)
//	get:    key                         -> value          (blocks)
//	wait:   key, key, ...               -> (nothing)      (blocks)
//	add:    key, delta (8-byte int64)   -> new value (8-byte int64)
//	check:  key, key, ...               -> the keys among them not yet set
//	cancel: (id of a blocking request)  -> no response; the server stops waiting
//
// The status is 0 for success, 1 for an error (one field: the message) and 2
// when the hello names another job than the server's (the message names both
// job ids; the client returns an error wrapping ErrJobMismatch). A client sends
// hello first and waits for its answer before any other request; a server
// answers nothing else until it has accepted the hello.
package rendezvous
