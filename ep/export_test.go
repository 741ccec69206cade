package ep

// Close's steps, for tests that act between them.
const (
	StepWaitPins = stepWaitPins
	StepPinsZero = stepPinsZero
	StepClosing  = stepClosing
)

// CloseStep is closeStep, for tests.
type CloseStep = closeStep

// SetCloseHook makes Close call f at each of its steps. Set it before Close.
func SetCloseHook(q *Queue, f func(CloseStep)) { q.closeHook = f }
