// Package rowmajor cuts parts out of the values of a row-major tensor held
// as a host slice: the shard of a full parameter that a rank holds, which
// the tests (internal/testing/testutil) and the ablation's checks (ablate)
// take from an unsharded reference. It is internal: programs cut tensors
// with parallel/shard.
package rowmajor
