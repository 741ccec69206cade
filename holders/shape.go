package holders

import (
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
)

// ModelShape is the part of a transformer's shape that sizes its KV cache.
type ModelShape struct {
	Layers     int // transformer layers
	KVHeads    int // key/value heads (fewer than query heads with GQA)
	HeadDim    int // dimensions per head
	DTypeBytes int // bytes per element: 2 for fp16/bf16, 1 for fp8
}

// BytesPerToken returns the KV bytes one token takes:
// 2 (K and V) x layers x kv heads x head dim x dtype bytes.
func (s ModelShape) BytesPerToken() memapi.Bytes {
	return memapi.Bytes(2 * s.Layers * s.KVHeads * s.HeadDim * s.DTypeBytes)
}

// Validate reports a shape with a non-positive figure as ErrInvalidSize.
func (s ModelShape) Validate() error {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.DTypeBytes <= 0 {
		return memapi.Errorf("holders.ModelShape", memapi.ErrInvalidSize, "every figure of %s must be positive", s.describe())
	}
	return nil
}

// describe says the shape's figures, for errors.
func (s ModelShape) describe() string {
	return fmt.Sprintf("%d layers x %d kv heads x %d dims x %d bytes", s.Layers, s.KVHeads, s.HeadDim, s.DTypeBytes)
}
