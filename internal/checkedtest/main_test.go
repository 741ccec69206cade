package checkedtest

import (
	"testing"

	"go.uber.org/goleak"
)

// The wrapper starts no goroutines; neither may anything these tests run.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
