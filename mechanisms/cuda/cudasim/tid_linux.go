//go:build linux

package cudasim

import "syscall"

// threadID names the calling OS thread: the CUDA context is current per thread.
func threadID() int { return syscall.Gettid() }
