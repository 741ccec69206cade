// Package gguf writes and checks GGUF files (version 3), the model format of
// llama.cpp: a header, key-value metadata, tensor descriptions and the
// tensors' data at aligned offsets. It writes the tiny llama model the
// integration's tests run (Tiny) and checks a file before llama.cpp is given
// it (Check), so that a missing, truncated or corrupt file is a typed error
// rather than whatever the library makes of it.
package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
)

// Value types of the metadata.
const (
	typeUint32  = 4
	typeInt32   = 5
	typeFloat32 = 6
	typeBool    = 7
	typeString  = 8
	typeArray   = 9
	typeUint64  = 10
)

// Tensor types this package writes (ggml_type).
const (
	TypeF32  = 0
	TypeF16  = 1
	TypeQ8_0 = 8
)

// q8Block is Q8_0's block: 32 values stored as a half-precision scale and
// 32 signed bytes (34 bytes).
const (
	q8Block      = 32
	q8BlockBytes = 2 + q8Block
)

const (
	magic     = "GGUF"
	version   = 3
	alignment = 32
)

// KV is one metadata entry; Value is a string, uint32, int32, float32,
// bool, uint64 or a RawValue.
type KV struct {
	Key   string
	Value any
}

// RawValue is a metadata value as a GGUF file encodes it: its type and
// the bytes after it (for an array: the element type, the count and the
// elements). Check keeps every entry so (Info.Raw), and Write writes it
// back unchanged: a tokenizer's arrays are copied from one file to
// another so.
type RawValue struct {
	Type  uint32
	Bytes []byte
}

// ArrayLen is the element count of an array value (0 for any other).
func (v RawValue) ArrayLen() uint64 {
	if v.Type != typeArray || len(v.Bytes) < 12 {
		return 0
	}
	return binary.LittleEndian.Uint64(v.Bytes[4:12])
}

// Tensor is one tensor: its name, dimensions (ne0 first), its type in the
// file (TypeF32, the zero value; TypeF16: the values are rounded to half
// precision, to nearest even, as they are written; TypeQ8_0: quantized as
// llama.cpp's reference quantizer does, in blocks of 32 along ne0, which
// must be a multiple of 32) and its values.
type Tensor struct {
	Name string
	Dims []uint64
	Type uint32
	Data []float32
}

// dataSize is the bytes of n values of the tensor in the file.
func (t Tensor) dataSize(n uint64) uint64 {
	switch t.Type {
	case TypeF16:
		return 2 * n
	case TypeQ8_0:
		return n / q8Block * q8BlockBytes
	}
	return 4 * n
}

// Write writes a GGUF file of the metadata and tensors to w, from its
// current offset (the data section is aligned relative to it).
func Write(w io.WriteSeeker, kvs []KV, tensors []Tensor) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	le := binary.LittleEndian
	var scratch [8]byte
	u32 := func(v uint32) { le.PutUint32(scratch[:4], v); bw.Write(scratch[:4]) }
	u64 := func(v uint64) { le.PutUint64(scratch[:8], v); bw.Write(scratch[:8]) }
	str := func(s string) { u64(uint64(len(s))); bw.WriteString(s) }

	bw.WriteString(magic)
	u32(version)
	u64(uint64(len(tensors)))
	u64(uint64(len(kvs)))
	for _, kv := range kvs {
		str(kv.Key)
		switch v := kv.Value.(type) {
		case string:
			u32(typeString)
			str(v)
		case uint32:
			u32(typeUint32)
			u32(v)
		case int32:
			u32(typeInt32)
			u32(uint32(v))
		case float32:
			u32(typeFloat32)
			u32(math.Float32bits(v))
		case bool:
			u32(typeBool)
			b := byte(0)
			if v {
				b = 1
			}
			bw.WriteByte(b)
		case uint64:
			u32(typeUint64)
			u64(v)
		case RawValue:
			u32(v.Type)
			bw.Write(v.Bytes)
		default:
			return fmt.Errorf("gguf: metadata %s: unsupported value type %T", kv.Key, kv.Value)
		}
	}
	var off uint64
	for _, t := range tensors {
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		if n != uint64(len(t.Data)) {
			return fmt.Errorf("gguf: tensor %s: %d values for dimensions %v", t.Name, len(t.Data), t.Dims)
		}
		str(t.Name)
		u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			u64(d)
		}
		if t.Type != TypeF32 && t.Type != TypeF16 && t.Type != TypeQ8_0 {
			return fmt.Errorf("gguf: tensor %s: type %d is not F32, F16 or Q8_0", t.Name, t.Type)
		}
		if t.Type == TypeQ8_0 && (len(t.Dims) == 0 || t.Dims[0]%q8Block != 0) {
			return fmt.Errorf("gguf: tensor %s: Q8_0 needs rows (ne0) of a multiple of %d values, not %v", t.Name, q8Block, t.Dims)
		}
		u32(t.Type)
		u64(off)
		off = pad(off+t.dataSize(n), alignment)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return writeData(w, tensors)
}

// writeData pads the file to the alignment and writes the tensors, each
// padded to the alignment. w has received the header already.
func writeData(w io.WriteSeeker, tensors []Tensor) error {
	at, err := w.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	zeros := make([]byte, alignment)
	bw.Write(zeros[:pad(uint64(at), alignment)-uint64(at)])
	var buf [q8BlockBytes]byte
	for _, t := range tensors {
		switch t.Type {
		case TypeQ8_0:
			for i := 0; i < len(t.Data); i += q8Block {
				quantizeQ8(buf[:], t.Data[i:i+q8Block])
				bw.Write(buf[:])
			}
		case TypeF16:
			for _, v := range t.Data {
				binary.LittleEndian.PutUint16(buf[:2], Float16(v))
				bw.Write(buf[:2])
			}
		default:
			for _, v := range t.Data {
				binary.LittleEndian.PutUint32(buf[:4], math.Float32bits(v))
				bw.Write(buf[:4])
			}
		}
		n := t.dataSize(uint64(len(t.Data)))
		bw.Write(zeros[:pad(n, alignment)-n])
	}
	return bw.Flush()
}

// quantizeQ8 writes one Q8_0 block of the 32 values x into dst (34 bytes),
// as llama.cpp's quantize_row_q8_0_ref does: the scale d = max|x| / 127 in
// half precision, then each value x/d rounded half away from zero.
func quantizeQ8(dst []byte, x []float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(dst[:2], Float16(d))
	for j, v := range x {
		dst[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

// Float16 is f in IEEE 754 half precision, rounded to nearest even:
// beyond the largest half it is an infinity, below the smallest
// subnormal a zero, and a NaN stays a NaN.
func Float16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case exp >= 31: // too large, or an infinity
		return sign | 0x7c00
	case exp <= 0: // a subnormal half, or zero
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - exp)
		half := mant >> shift
		rem, mid := mant&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > mid || rem == mid && half&1 == 1 {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && half&1 == 1 {
		half++ // a carry into the exponent is the right rounding
	}
	return sign | uint16(half)
}

func pad(n, a uint64) uint64 { return (n + a - 1) / a * a }

// WriteFile writes the file at path (through a temporary file renamed into
// place).
func WriteFile(path string, kvs []KV, tensors []Tensor) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := Write(f, kvs, tensors); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}
