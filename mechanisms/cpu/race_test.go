//go:build race

package cpu

// raceEnabled is set when the race detector runs: its shadow memory needs
// mappings of its own, so a test that spends all of them cannot run.
const raceEnabled = true
