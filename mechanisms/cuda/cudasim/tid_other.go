//go:build !linux

package cudasim

// threadID is constant where the thread id is not available: the simulator
// then tracks one current context per process.
func threadID() int { return 0 }
