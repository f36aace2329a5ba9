//go:build !race

package wdlease

const raceOn = false
