// Package hostsync is a comm.Comm decorator that runs every op of the
// transport it wraps as a host synchronisation: before the op it waits
// for the device's queued work (Device.Sync), it queues the op on the
// transport's own stream (a nil comm.Stream, whatever stream the caller
// gives) and waits for it on the host, so that the device's next work
// sees the result; each op returns comm.Done. Correct, not fast.
//
// It is a debugging aid (launch's ASYNCTP_SYNC_COLLECTIVES=1), to tell a
// stream-ordering bug from a transport's: the losses must not change, only
// the speed. It also serves a backend without a CUDA stream (the kernel
// emulator), whose work cannot be ordered on one.
//
// The decorator is a comm.Wrapper: the capabilities of the transport (its
// symmetric memory, comm.SymmetricOf) are found through it; it passes
// Abort on, and the groups split from it are wrapped alike. It sits beside
// comm, so that comm itself knows nothing of a device.
package hostsync
