// Package work is a downstream package that submits device work on owning
// handles' memory.
package work

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Work that nothing covers.

func uncovered(st memapi.Stream, buf *pmm.Buffer, data []byte) error {
	return st.CopyToDevice(buf.Addr(), data) // want `device work on the memory of buf is submitted here, and the return at line 16 is reached without buf.RecordUse of a fence recorded after it \(or st.Synchronize\)`
}

func closedUnderWork(st memapi.Stream, r *pmm.Region, data []byte) error {
	if err := st.CopyToDevice(r.Addr()+4096, data); err != nil { // want `device work on the memory of r is submitted here`
		return err
	}
	return r.Close()
}

func recordFails(st memapi.Stream, src, dst *pmm.Buffer) error {
	err := st.CopyDevice(dst.Addr(), src.Addr(), src.Size()) // want `memory of dst` `memory of src`
	if err != nil {
		return err
	}
	f, err := st.Record()
	if err != nil {
		return err // the work is in flight and no fence covers it
	}
	return errors.Join(dst.RecordUse(f), src.RecordUse(f))
}

// Work covered by a fence, a synchronize, or whoever receives the handle.

func recorded(st memapi.Stream, buf *pmm.Buffer, data []byte) error {
	if err := st.CopyToDevice(buf.Addr(), data); err != nil {
		return err
	}
	f, err := st.Record()
	if err != nil {
		return errors.Join(err, st.Synchronize(context.Background()))
	}
	return buf.RecordUse(f)
}

func synchronized(ctx context.Context, st memapi.Stream, r *pmm.Region, data []byte) error {
	err := st.CopyToDevice(r.Addr(), data)
	if err == nil {
		err = st.Synchronize(ctx)
	}
	return errors.Join(err, r.Close())
}

func handedOn(st memapi.Stream, buf *pmm.Buffer, out []byte) (*pmm.Buffer, error) {
	if err := st.CopyFromDevice(out, buf.Addr()); err != nil {
		return nil, err
	}
	return buf, nil // the caller records
}

// Work on plain addresses is not tied to a handle here.
func plain(st memapi.Stream, addr memapi.DeviceAddr, data []byte) error {
	return st.CopyToDevice(addr, data)
}

// The escape, with its reason.
func escaped(st memapi.Stream, buf *pmm.Buffer, data []byte) error {
	//memvet:allow the caller synchronizes the stream before it closes buf
	return st.CopyToDevice(buf.Addr(), data)
}
