package pmm

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
)

// defaultStaging is Transfer's chunk when none is given.
const defaultStaging memapi.Bytes = 4 << 20

// Transfer copies n bytes from src on srcCtx to dst on dstCtx through a
// host staging buffer of at most chunk bytes (0: n, at most 4 MiB): each chunk is copied out on a
// stream of the source context, synchronized, then copied in on a stream of
// the destination context and synchronized before the buffer is reused. It
// works between any two contexts (a GPU and the host, two CPU mechanisms).
func Transfer(ctx context.Context, chunk memapi.Bytes, dstCtx memapi.DeviceContext, dst memapi.DeviceAddr, srcCtx memapi.DeviceContext, src memapi.DeviceAddr, n memapi.Bytes) (err error) {
	in, err := srcCtx.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, in.Close()) }()
	out, err := dstCtx.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, out.Close()) }()
	if chunk == 0 {
		chunk = min(n, defaultStaging)
	}
	stage := make([]byte, min(chunk, n))
	for off := memapi.Bytes(0); off < n; off += chunk {
		b := stage[:min(chunk, n-off)]
		if err := in.CopyFromDevice(b, src+memapi.DeviceAddr(off)); err != nil {
			return err
		}
		if err := in.Synchronize(ctx); err != nil {
			return err
		}
		if err := out.CopyToDevice(dst+memapi.DeviceAddr(off), b); err != nil {
			return err
		}
		if err := out.Synchronize(ctx); err != nil {
			return err
		}
	}
	return nil
}
