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
	TypeF32 = 0
	TypeF16 = 1
)

const (
	magic     = "GGUF"
	version   = 3
	alignment = 32
)

// KV is one metadata entry; Value is a string, uint32, int32, float32,
// bool or uint64.
type KV struct {
	Key   string
	Value any
}

// Tensor is one F32 tensor: its name, dimensions (ne0 first) and data.
type Tensor struct {
	Name string
	Dims []uint64
	Data []float32
}

// Write writes a GGUF file of the metadata and F32 tensors to w, from
// its current offset (the data section is aligned relative to it).
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
		u32(TypeF32)
		u64(off)
		off = pad(off+4*n, alignment)
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
	var buf [4]byte
	for _, t := range tensors {
		for _, v := range t.Data {
			binary.LittleEndian.PutUint32(buf[:], math.Float32bits(v))
			bw.Write(buf[:])
		}
		n := 4 * uint64(len(t.Data))
		bw.Write(zeros[:pad(n, alignment)-n])
	}
	return bw.Flush()
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
