package ort

import (
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// parseTensorProto decodes an onnx.TensorProto (the conformance models'
// input_N.pb and output_N.pb) into a host tensor: dims (1), data_type (2),
// float_data (4), int32_data (5), string_data (6), int64_data (7),
// raw_data (9), double_data (10), uint64_data (11). Externally stored data
// is not supported.
func parseTensorProto(b []byte) (tensor, error) {
	var t tensor
	var raw []byte
	var hasRaw bool
	var floats []float32
	var doubles []float64
	var ints []uint64 // int32_data, int64_data, uint64_data: varints
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return t, protowire.ParseError(n)
		}
		b = b[n:]
		var err error
		switch {
		case num == 1 && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			t.Shape = append(t.Shape, int64(v))
		case num == 1 && typ == protowire.BytesType:
			n, err = packedVarints(b, func(v uint64) { t.Shape = append(t.Shape, int64(v)) })
		case num == 2 && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			t.Elem = int(v)
		case num == 4 && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			for i := 0; i+4 <= len(p); i += 4 {
				floats = append(floats, math.Float32frombits(binary.LittleEndian.Uint32(p[i:])))
			}
		case num == 4 && typ == protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			floats = append(floats, math.Float32frombits(v))
		case (num == 5 || num == 7 || num == 11) && typ == protowire.BytesType:
			n, err = packedVarints(b, func(v uint64) { ints = append(ints, v) })
		case (num == 5 || num == 7 || num == 11) && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			ints = append(ints, v)
		case num == 6 && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			t.Strings = append(t.Strings, string(p))
		case num == 9 && typ == protowire.BytesType:
			raw, n = protowire.ConsumeBytes(b)
			hasRaw = true
		case num == 10 && typ == protowire.BytesType:
			var p []byte
			p, n = protowire.ConsumeBytes(b)
			for i := 0; i+8 <= len(p); i += 8 {
				doubles = append(doubles, math.Float64frombits(binary.LittleEndian.Uint64(p[i:])))
			}
		case num == 10 && typ == protowire.Fixed64Type:
			var v uint64
			v, n = protowire.ConsumeFixed64(b)
			doubles = append(doubles, math.Float64frombits(v))
		case num == 13 || num == 14 && typ == protowire.VarintType && len(b) > 0 && b[0] == 1:
			return t, fmt.Errorf("externally stored tensor data is not supported")
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if err != nil {
			return t, err
		}
		if n < 0 {
			return t, protowire.ParseError(n)
		}
		b = b[n:]
	}
	if t.Elem == elemString {
		return t, nil
	}
	sz, ok := elemSize[t.Elem]
	if !ok {
		return t, fmt.Errorf("element type %d is not supported by the harness", t.Elem)
	}
	count := t.count()
	if hasRaw {
		t.Data = raw
	} else {
		t.Data = make([]byte, 0, count*sz)
		switch {
		case len(floats) > 0 || t.Elem == elemFloat:
			for _, f := range floats {
				t.Data = binary.LittleEndian.AppendUint32(t.Data, math.Float32bits(f))
			}
		case len(doubles) > 0 || t.Elem == elemDouble:
			for _, f := range doubles {
				t.Data = binary.LittleEndian.AppendUint64(t.Data, math.Float64bits(f))
			}
		default: // integers of every width, bool, float16, bfloat16, float8: low bytes of each varint
			for _, v := range ints {
				var buf [8]byte
				binary.LittleEndian.PutUint64(buf[:], v)
				t.Data = append(t.Data, buf[:sz]...)
			}
		}
	}
	if len(t.Data) != count*sz {
		return t, fmt.Errorf("element type %d, shape %v: %d bytes of data, want %d", t.Elem, t.Shape, len(t.Data), count*sz)
	}
	return t, nil
}

func packedVarints(b []byte, f func(uint64)) (int, error) {
	p, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	for len(p) > 0 {
		v, m := protowire.ConsumeVarint(p)
		if m < 0 {
			return 0, protowire.ParseError(m)
		}
		f(v)
		p = p[m:]
	}
	return n, nil
}
