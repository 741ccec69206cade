package clihelp

// The exit codes of memgen, memctl and memdemo: one meaning each, the same
// in every command.
const (
	// ExitOK: the command did what it was asked, and every check passed.
	ExitOK = 0
	// ExitFailed: the command ran and found a problem, or could not
	// complete: a spec error or drift (memgen), a ledger error (memctl), a
	// failed check (memdemo), a conformance failure (memgen plugin-check).
	ExitFailed = 1
	// ExitUsage: the command line is wrong (an unknown command or flag, a
	// bad value); nothing was done.
	ExitUsage = 2
	// ExitRefused: a well-formed request that the state it met does not
	// allow (a stale ledger revision, a mechanism name the spec already
	// has); nothing changed, and the message says what would.
	ExitRefused = 3
)

// ExitCodes is the paragraph every command's help ends its overview with.
const ExitCodes = `Exit codes (the same for memgen, memctl and memdemo): 0 done, every check
passed; 1 a failure (the command ran and found a problem, or could not
complete); 2 a usage error, nothing done; 3 refused: the request was well
formed but the state does not allow it, nothing changed.
`
