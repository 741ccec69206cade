package ort

import (
	"fmt"
	"math"
	"os"
	"syscall"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memgen/memgen/generated/memapi"
)

// graph is what the decoder and its plan read of an ONNX model before
// ONNX Runtime loads it: its nodes (operator, domain, inputs, integer
// attributes), the dimensions and element types of its initializers, and
// the element types and shapes of its declared inputs and outputs, from
// the protobuf (ModelProto.graph 7; GraphProto.node 1, initializer 5,
// input 11, output 12; NodeProto.input 1, output 2, op_type 4, attribute
// 5, domain 7; AttributeProto.name 1, f 2, i 3; TensorProto.dims 1, data_type 2, name 8;
// ValueInfoProto.name 1, type 2; TypeProto.tensor_type 1;
// TypeProto.Tensor.elem_type 1, shape 2; TensorShapeProto.dim 1;
// Dimension.dim_value 1, dim_param 2). Everything else is skipped, the
// weights' bytes included.
type graph struct {
	nodes   []node
	dims    map[string][]int64 // initializer name -> dims
	types   map[string]int64   // initializer name -> TensorProto.DataType
	order   []string           // the initializers' names in the file's order
	inputs  []valueInfo
	outputs []valueInfo
}

// valueInfo is a declared input or output: its element type
// (TensorProto.DataType) and its dimensions, a symbolic one as -1.
type valueInfo struct {
	name   string
	elem   int64
	dims   []int64
	params []string // each dimension's dim_param ("" for a fixed one)
}

type node struct {
	op, domain string
	inputs     []string
	outs       []string // the outputs' names ("" for an omitted one)
	outputs    int
	ints       map[string]int64
	floats     map[string]float32
}

// readGraph reads the graph of the ONNX model at path. The file is mapped
// for the read, not copied: only the pages holding what is read (not the
// weights' bytes, which are skipped) are ever touched, and none of them
// stays resident once the map is gone. An empty or unparsable file matches
// ErrBadModel, as ONNX Runtime's refusal of it does.
func readGraph(path string) (*graph, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() == 0 {
		return nil, fmt.Errorf("%w: the model's protobuf: the file is empty", ErrBadModel)
	}
	if int64(int(st.Size())) != st.Size() {
		return nil, fmt.Errorf("the model's protobuf: %d bytes cannot be mapped", st.Size())
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping the model: %w", err)
	}
	defer syscall.Munmap(b)
	g := &graph{dims: map[string][]int64{}, types: map[string]int64{}}
	err = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if num == 7 && typ == protowire.BytesType {
			return g.read(v)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: the model's protobuf: %w", ErrBadModel, err)
	}
	return g, nil
}

func (g *graph) read(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			n, err := readNode(v)
			g.nodes = append(g.nodes, n)
			return err
		case num == 5 && typ == protowire.BytesType:
			name, dims, dt, err := readInitializer(v)
			g.dims[name], g.types[name] = dims, dt
			g.order = append(g.order, name)
			return err
		case (num == 11 || num == 12) && typ == protowire.BytesType:
			vi, err := readValueInfo(v)
			if num == 11 {
				g.inputs = append(g.inputs, vi)
			} else {
				g.outputs = append(g.outputs, vi)
			}
			return err
		}
		return nil
	})
}

// readValueInfo reads a ValueInfoProto of a tensor.
func readValueInfo(b []byte) (valueInfo, error) {
	var vi valueInfo
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			vi.name = string(v)
		case num == 2 && typ == protowire.BytesType:
			return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num != 1 || typ != protowire.BytesType { // TypeProto.tensor_type
					return nil
				}
				return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
					switch {
					case num == 1 && typ == protowire.VarintType:
						vi.elem = int64(x)
					case num == 2 && typ == protowire.BytesType: // the shape
						return fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
							if num != 1 || typ != protowire.BytesType {
								return nil
							}
							d, param := int64(-1), ""
							err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
								switch {
								case num == 1 && typ == protowire.VarintType:
									d = int64(x)
								case num == 2 && typ == protowire.BytesType:
									param = string(v)
								}
								return nil
							})
							vi.dims, vi.params = append(vi.dims, d), append(vi.params, param)
							return err
						})
					}
					return nil
				})
			})
		}
		return nil
	})
	return vi, err
}

func readNode(b []byte) (node, error) {
	n := node{ints: map[string]int64{}, floats: map[string]float32{}}
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		if typ != protowire.BytesType {
			return nil
		}
		switch num {
		case 1:
			n.inputs = append(n.inputs, string(v))
		case 2:
			n.outs = append(n.outs, string(v))
			n.outputs++
		case 4:
			n.op = string(v)
		case 7:
			n.domain = string(v)
		case 5:
			var name string
			var i int64
			var f float32
			var hasI, hasF bool
			err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch {
				case num == 1 && typ == protowire.BytesType:
					name = string(v)
				case num == 3 && typ == protowire.VarintType:
					i, hasI = int64(x), true
				}
				return nil
			})
			if err != nil {
				return err
			}
			// AttributeProto.f (2) is a fixed32, which fields skips.
			if fv, ok := attrFloat(v); ok {
				f, hasF = fv, true
			}
			if hasI {
				n.ints[name] = i
			}
			if hasF {
				n.floats[name] = f
			}
		}
		return nil
	})
	return n, err
}

// attrFloat returns an AttributeProto's f (field 2, fixed32), if any.
func attrFloat(b []byte) (float32, bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 2 && typ == protowire.Fixed32Type {
			x, m := protowire.ConsumeFixed32(b)
			if m < 0 {
				return 0, false
			}
			return math.Float32frombits(x), true
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return 0, false
		}
		b = b[m:]
	}
	return 0, false
}

func readInitializer(b []byte) (name string, dims []int64, dataType int64, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case num == 8 && typ == protowire.BytesType:
			name = string(v)
		case num == 2 && typ == protowire.VarintType:
			dataType = int64(x)
		case num == 1 && typ == protowire.VarintType:
			dims = append(dims, int64(x))
		case num == 1 && typ == protowire.BytesType:
			for len(v) > 0 {
				d, n := protowire.ConsumeVarint(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				dims, v = append(dims, int64(d)), v[n:]
			}
		}
		return nil
	})
	return name, dims, dataType, err
}

// fields calls f with each field of the message b: its number, wire type
// and, for a length-delimited field its bytes, for a varint its value.
func fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// LimitError refuses a decoder whose declarations its model contradicts,
// or a MaxSeq beyond what its model can encode, before any byte is
// committed; it matches memapi.ErrInvalidSize.
type LimitError struct {
	Field  string // "MaxSeq", "kv_num_heads", "head_size"
	Value  int64  // what was asked or declared
	Limit  int64  // what the model allows
	Reason string // where the limit comes from
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("ort: %s %d, the model allows %d: %s", e.Field, e.Value, e.Limit, e.Reason)
}

// Unwrap reports memapi.ErrInvalidSize.
func (e *LimitError) Unwrap() error { return memapi.ErrInvalidSize }
