package ort

import (
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protowire"
)

// WarmUp makes, runs and releases a session of a one-node model (the Relu
// of one float), so that what ONNX Runtime takes once per process (the
// code of session creation and of a run paged in, its thread pool, its
// first allocations) is taken before a caller measures its baseline, and
// is not counted against the first model it loads. A plan sizes a model;
// the runtime's own start is not the model's. Init must have loaded the
// runtime.
func WarmUp() error {
	const op = "ort.WarmUp"
	f, err := os.CreateTemp("", "memgen-ort-warm-*.onnx")
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(warmModel())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s, err := newSessionWith(f.Name(), 0, 1)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer s.close()
	if _, err := s.run([]tensor{{Elem: elemFloat, Shape: []int64{1}, Data: make([]byte, 4)}}); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// warmModel is the protobuf of a model whose graph is y = Relu(x), x and
// y float [1] (ModelProto.ir_version 1, graph 7, opset_import 8;
// OperatorSetIdProto.version 2; GraphProto.node 1, name 2, input 11,
// output 12; NodeProto.input 1, output 2, op_type 4; ValueInfoProto.name
// 1, type 2; TypeProto.tensor_type 1; its elem_type 1, shape 2;
// TensorShapeProto.dim 1; Dimension.dim_value 1).
func warmModel() []byte {
	msg := func(num protowire.Number, parts ...[]byte) []byte {
		var body []byte
		for _, p := range parts {
			body = append(body, p...)
		}
		b := protowire.AppendTag(nil, num, protowire.BytesType)
		return protowire.AppendBytes(b, body)
	}
	str := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), s)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	value := func(num protowire.Number, name string) []byte {
		return msg(num, str(1, name), msg(2, msg(1, varint(1, elemFloat), msg(2, msg(1, varint(1, 1))))))
	}
	graph := msg(7, msg(1, str(1, "x"), str(2, "y"), str(4, "Relu")), str(2, "warm"), value(11, "x"), value(12, "y"))
	return append(append(varint(1, 8), graph...), msg(8, varint(2, 17))...)
}
