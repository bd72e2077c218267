//go:build !unix

package main

// processAlive cannot tell here: every lock counts as held.
func processAlive(pid int) bool { return true }
