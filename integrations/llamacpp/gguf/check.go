package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Kinds of FormatError.
var (
	// ErrMissing: the file does not exist or cannot be opened.
	ErrMissing = errors.New("gguf: missing")
	// ErrTruncated: the file ends before what its header describes.
	ErrTruncated = errors.New("gguf: truncated")
	// ErrCorrupt: the bytes are not a GGUF file this package can read
	// (magic, version, a count or a length out of bounds, a tensor outside
	// the data section).
	ErrCorrupt = errors.New("gguf: corrupt")
)

// FormatError says why a file is not a usable GGUF file.
type FormatError struct {
	Path   string
	Kind   error // ErrMissing, ErrTruncated or ErrCorrupt
	Offset int64 // where reading stopped
	Detail string
	Err    error // the underlying error, if any
}

func (e *FormatError) Error() string {
	s := fmt.Sprintf("%v: %s at byte %d: %s", e.Kind, e.Path, e.Offset, e.Detail)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap reports the kind and the underlying error.
func (e *FormatError) Unwrap() []error {
	if e.Err != nil {
		return []error{e.Kind, e.Err}
	}
	return []error{e.Kind}
}

// Info is what Check read: the metadata this package understands and every
// tensor's description.
type Info struct {
	Size int64 // the file's size
	// Data is where the data section starts in the file: a tensor's
	// bytes are at Data + its Offset.
	Data    int64
	Meta    map[string]any
	Tensors []TensorInfo
	// Raw is every metadata entry as the file encodes it (RawValue), in
	// the file's order: what Write copies into another file.
	Raw []KV
}

// TensorInfo describes one tensor of the file.
type TensorInfo struct {
	Name   string
	Dims   []uint64
	Type   uint32
	Offset uint64 // from the start of the data section
}

// Uint returns the metadata value key as an unsigned integer.
func (in *Info) Uint(key string) (uint64, bool) {
	switch v := in.Meta[key].(type) {
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int32:
		if v >= 0 {
			return uint64(v), true
		}
	}
	return 0, false
}

// String returns the metadata value key as a string.
func (in *Info) String(key string) string {
	s, _ := in.Meta[key].(string)
	return s
}

// Tensor returns the description of the tensor called name.
func (in *Info) Tensor(name string) (TensorInfo, bool) {
	for _, t := range in.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// typeSize gives the block size in elements and bytes of the ggml types
// whose layout this package knows; others are checked for their offset
// only.
var typeSize = map[uint32][2]uint64{
	0:  {1, 4},     // F32
	1:  {1, 2},     // F16
	2:  {32, 18},   // Q4_0
	3:  {32, 20},   // Q4_1
	6:  {32, 22},   // Q5_0
	7:  {32, 24},   // Q5_1
	8:  {32, 34},   // Q8_0
	10: {256, 84},  // Q2_K
	11: {256, 110}, // Q3_K
	12: {256, 144}, // Q4_K
	13: {256, 176}, // Q5_K
	14: {256, 210}, // Q6_K
	30: {1, 2},     // BF16
}

// Limits that keep a corrupt count from allocating without bound.
const (
	maxCount  = 1 << 24
	maxString = 1 << 26
	maxDims   = 4
)

type reader struct {
	r   *bufio.Reader
	off int64
	err error
	// capture, while set, receives every byte read.
	capture *[]byte
}

func (r *reader) read(n int) []byte {
	if r.err != nil {
		return nil
	}
	b := make([]byte, n)
	m, err := io.ReadFull(r.r, b)
	r.off += int64(m)
	if err != nil {
		r.err = err
		return nil
	}
	if r.capture != nil {
		*r.capture = append(*r.capture, b...)
	}
	return b
}

func (r *reader) u32() uint32 {
	b := r.read(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) u64() uint64 {
	b := r.read(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

var errBound = errors.New("out of bounds")

func (r *reader) str() string {
	n := r.u64()
	if r.err == nil && n > maxString {
		r.err = fmt.Errorf("%w: a string of %d bytes", errBound, n)
	}
	return string(r.read(int(n)))
}

func (r *reader) value(t uint32, depth int) any {
	switch t {
	case 0, 1, typeBool:
		b := r.read(1)
		if b == nil || t != typeBool {
			return nil
		}
		return b[0] != 0
	case 2, 3:
		r.read(2)
		return nil
	case typeUint32:
		return r.u32()
	case typeInt32:
		return int32(r.u32())
	case typeFloat32:
		return math.Float32frombits(r.u32())
	case typeString:
		return r.str()
	case typeUint64:
		return r.u64()
	case 11, 12:
		r.u64()
		return nil
	case typeArray:
		et := r.u32()
		n := r.u64()
		if r.err == nil && (n > maxCount || depth > 2) {
			r.err = fmt.Errorf("%w: an array of %d values", errBound, n)
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			r.value(et, depth+1)
		}
		return nil
	default:
		if r.err == nil {
			r.err = fmt.Errorf("%w: value type %d", errBound, t)
		}
		return nil
	}
}

// Check reads the file's header and tensor descriptions and checks that
// every tensor lies inside the file. A file that cannot be opened is
// ErrMissing; one that ends early, ErrTruncated; any other inconsistency,
// ErrCorrupt.
func Check(path string) (*Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FormatError{Path: path, Kind: ErrMissing, Detail: "cannot open", Err: err}
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &FormatError{Path: path, Kind: ErrMissing, Detail: "cannot stat", Err: err}
	}
	if !st.Mode().IsRegular() {
		return nil, &FormatError{Path: path, Kind: ErrMissing, Detail: "not a regular file"}
	}
	r := &reader{r: bufio.NewReaderSize(f, 1<<16)}
	fail := func(detail string) (*Info, error) {
		kind := ErrCorrupt
		if errors.Is(r.err, io.EOF) || errors.Is(r.err, io.ErrUnexpectedEOF) {
			kind = ErrTruncated
		}
		return nil, &FormatError{Path: path, Kind: kind, Offset: r.off, Detail: detail, Err: r.err}
	}
	if m := r.read(4); r.err != nil || string(m) != magic {
		if r.err == nil {
			r.err = fmt.Errorf("magic %q", m)
		}
		return fail("no GGUF magic")
	}
	if v := r.u32(); r.err == nil && v != 2 && v != 3 {
		r.err = fmt.Errorf("version %d", v)
		return fail("unsupported version")
	}
	nt, nkv := r.u64(), r.u64()
	if r.err == nil && (nt > maxCount || nkv > maxCount) {
		r.err = fmt.Errorf("%w: %d tensors, %d metadata entries", errBound, nt, nkv)
	}
	if r.err != nil {
		return fail("header")
	}
	in := &Info{Size: st.Size(), Meta: map[string]any{}}
	for i := uint64(0); i < nkv; i++ {
		k := r.str()
		t := r.u32()
		var raw []byte
		r.capture = &raw
		v := r.value(t, 0)
		r.capture = nil
		if r.err != nil {
			return fail(fmt.Sprintf("metadata entry %d", i))
		}
		in.Meta[k] = v
		in.Raw = append(in.Raw, KV{Key: k, Value: RawValue{Type: t, Bytes: raw}})
	}
	for i := uint64(0); i < nt; i++ {
		t := TensorInfo{Name: r.str()}
		nd := r.u32()
		if r.err == nil && nd > maxDims {
			r.err = fmt.Errorf("%w: %d dimensions", errBound, nd)
		}
		for j := uint32(0); j < nd && r.err == nil; j++ {
			t.Dims = append(t.Dims, r.u64())
		}
		t.Type = r.u32()
		t.Offset = r.u64()
		if r.err != nil {
			return fail(fmt.Sprintf("tensor description %d", i))
		}
		in.Tensors = append(in.Tensors, t)
	}
	align := uint64(alignment)
	if a, ok := in.Uint("general.alignment"); ok {
		if a == 0 || a&(a-1) != 0 {
			r.err = fmt.Errorf("general.alignment %d", a)
			return fail("alignment")
		}
		align = a
	}
	data := pad(uint64(r.off), align)
	in.Data = int64(data)
	for _, t := range in.Tensors {
		n := uint64(1)
		for _, d := range t.Dims {
			if d != 0 && n > math.MaxUint64/d {
				r.err = fmt.Errorf("%w: dimensions %v", errBound, t.Dims)
				return fail("tensor " + t.Name)
			}
			n *= d
		}
		end := data + t.Offset
		if sz, ok := typeSize[t.Type]; ok {
			if n%sz[0] != 0 {
				r.err = fmt.Errorf("%d elements of type %d (blocks of %d)", n, t.Type, sz[0])
				return fail("tensor " + t.Name)
			}
			end += n / sz[0] * sz[1]
		}
		if t.Offset%align != 0 || end < data || end > uint64(in.Size) {
			kind := ErrCorrupt
			if t.Offset%align == 0 && end > uint64(in.Size) {
				kind = ErrTruncated
			}
			return nil, &FormatError{Path: path, Kind: kind, Offset: int64(data + t.Offset),
				Detail: fmt.Sprintf("tensor %s (%d bytes at %d) beyond the file's %d bytes or unaligned", t.Name, end-data-t.Offset, data+t.Offset, in.Size)}
		}
	}
	return in, nil
}
