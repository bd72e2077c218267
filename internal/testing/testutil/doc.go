// Package testutil holds the helpers shared by the tests of asynctp: seeded
// random tensors that are never zero, comparison by relative norm, a
// central finite-difference gradient checker, a check of an error's
// message (ErrorContains), and a backend wrapper that counts host reads
// (HostReads).
package testutil
