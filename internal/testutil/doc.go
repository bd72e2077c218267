// Package testutil holds the helpers shared by the tests of asynctp: seeded
// random tensors that are never zero, comparison by relative norm, and a
// central finite-difference gradient checker.
package testutil
