// Package fix has the leaks whose fix is plain: defer the Close.
package fix

import (
	"context"

	"github.com/memgen/memgen/pmm"
)

func withErr(ctx context.Context, b *pmm.Binding) error {
	buf, err := b.Allocate(ctx, 1) // want `the pmm.Buffer buf is not closed`
	if err != nil {
		return err
	}
	_ = buf.Addr()
	return nil
}
