//go:build !race

package ort

// raceEnabled: the tests run under the race detector, whose shadow memory
// grows with the process's (resident-set bounds are not checked).
const raceEnabled = false
