package ep

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
)

// SiteDepth is how many frames of its maker's stack a Site keeps.
const SiteDepth = 10

// Site is the stack a handle was made on: program counters, as
// runtime.Callers writes them. Capturing one (runtime.Callers(skip,
// site[:])) costs a walk of the stack and the Site's one allocation;
// formatting it happens only when a report asks (Lifecycle.Origin).
type Site [SiteDepth]uintptr

// Origin is what a report says of where a handle came from: the bytes it
// holds, its address and, when the layer above captured it, the stack that
// made it.
type Origin struct {
	Bytes memapi.Bytes
	// Addr, when not zero, is the handle's address: its name is the label
	// it was made with followed by the address in hex ("… buffer
	// 0x7f3a00000000"), formatted only when a report or an error asks
	// (Lifecycle.Name), never on the path that makes the handle.
	Addr uint64
	Site *Site // nil: not captured
}

// Origin says where the handle came from: its bytes ("64KiB") and, when
// its site was captured, the first frame of the stack that made it outside
// memgen's own packages ("made at cache.go:42 (example.com/cache.(*C).Put)");
// memgen's tests count as outside. "" when nothing is known.
func (l *Lifecycle) Origin() string {
	var parts []string
	if l.origin.Bytes != 0 {
		parts = append(parts, fmt.Sprintf("%d bytes", l.origin.Bytes))
	}
	if s := l.origin.Site; s != nil {
		n := 0
		for n < len(s) && s[n] != 0 {
			n++
		}
		frames := runtime.CallersFrames(s[:n])
		var first, outside runtime.Frame
		for {
			f, more := frames.Next()
			if first.PC == 0 {
				first = f
			}
			if !insideMemgen(f) {
				outside = f
				break
			}
			if !more {
				break
			}
		}
		if outside.PC == 0 {
			outside = first
		}
		if outside.PC != 0 {
			parts = append(parts, fmt.Sprintf("made at %s:%d (%s)", filepath.Base(outside.File), outside.Line, outside.Function))
		}
	}
	return strings.Join(parts, ", ")
}

// insideMemgen reports whether f is in one of memgen's own packages (not
// a test file, not the code that uses it).
func insideMemgen(f runtime.Frame) bool {
	return strings.HasPrefix(f.Function, "github.com/memgen/memgen/") && !strings.HasSuffix(f.File, "_test.go")
}
