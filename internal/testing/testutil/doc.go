// Package testutil holds the helpers shared by the tests of asynctp: seeded
// random tensors that are never zero, comparison by relative norm, and a
// central finite-difference gradient checker, and a backend wrapper that
// counts host reads (HostReads).
package testutil
