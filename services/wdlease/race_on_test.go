//go:build race

package wdlease

// raceOn shortens the checker's short run under the race detector, which slows the pure simulation
// about five times and finds nothing in it (one goroutine).
const raceOn = true
