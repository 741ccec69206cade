//go:build race

package cuda

// raceEnabled is true when the tests run under -race, which makes byte loops
// over large buffers slow: the 2 MiB conformance variant is skipped then.
const raceEnabled = true
