//go:build !amd64

package plugin

import "github.com/ebitengine/purego"

// cCall calls a.fn with a's six arguments through purego and stores its
// integer result in a.r (amd64 has a fixed-register trampoline instead).
func cCall(a *cArgs) {
	a.r, _, _ = purego.SyscallN(a.fn, a.a[0], a.a[1], a.a[2], a.a[3], a.a[4], a.a[5])
}
