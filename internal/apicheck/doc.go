// Package apicheck holds the repository's checks of its public API, as
// tests run by go test ./... in CI: that the packages a program imports to
// build on asynctp pull in no plotting, progress-bar, font or PDF code
// (deps_test.go).
package apicheck
