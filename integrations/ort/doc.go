// Package ort puts ONNX Runtime's CPU allocations under a memgen binding.
//
// An Allocator is an OrtAllocator, registered with the process's ONNX
// Runtime environment (OrtApi::RegisterAllocator), whose Alloc, Reserve,
// Free, Info and GetStats are Go functions reached through a small cgo
// bridge. Alloc draws from a pool.Pool over a pmm.Binding: size-class
// slabs for requests up to 64 KiB, best fit above, over one growable
// region of the CPU mechanism; the pool's segments are reserved from the
// governor and charged to the binding's holder, and the Allocator is that
// holder (register it with governor.HolderOptions{Cache: true}): under
// pressure the governor asks its caches first, and it gives them back. In
// front of the pool a small cache in C (front.c) keeps freed blocks of up
// to 64 KiB per size class, so that ONNX Runtime's next Alloc of a class
// it holds, and a Free it has room for, make no cgo callback; it is
// bounded (Options.FrontBytes, Options.FrontDepth), counted as cache, and
// emptied into the pool first when pressure asks. Reserve, which ONNX Runtime uses for
// blocks its own arena would not cache (pre-packed weights), is a whole
// pmm.Buffer of the binding, outside the pool. GetStats reports the pool's
// figures under the BFC arena's keys. Sessions use the allocator when
// created with the session option `session.use_env_allocators` = "1"
// (SessionOptions does that); sessions created without it keep ONNX
// Runtime's own arena.
//
// Alloc and Free are called from ONNX Runtime's own threads; both are safe
// for concurrent use. Free finds the block from the pointer in O(1) (a
// sharded map from address to pool.Block, a value: no heap allocation per
// Alloc+Free). When the budget is exhausted (the pool trimmed its own cache,
// the governor asked the other holders and refused the reservation after
// Options.Wait), the allocation is refused and ONNX Runtime fails the
// session call with its own error status, whose message carries memgen's
// reason (a *pool.OverBudgetError with the pool's figures, wrapping the
// governor's *governor.OverBudgetError); the ledger is
// untouched and the session stays usable. The refusal reaches ONNX Runtime
// as a std::bad_alloc thrown by the Alloc entry point (alloc_thunk.cc), not
// as a NULL return: ONNX Runtime 1.30 dereferences a NULL from a custom
// allocator in places (a segmentation fault, found by this package's tests),
// while it turns every exception into its error status, as for its own CPU
// allocator's failures. A zero-byte request gets NULL, as OrtAllocator's
// contract says.
//
// A Decoder runs a decoder model whose attention is
// com.microsoft::GroupQueryAttention with its KV cache in memgen memory. A
// Sequence makes its tensors once and binds them to every Run: each cache
// tensor (one KV head of one layer, so that the rows in use are a prefix)
// is one OrtValue over a stable address, passed as both past and present
// (GroupQueryAttention's share buffer), so a step writes its row in place
// and changes only three small inputs. In KVGrow mode that address is a
// pmm.Region of the maximum length, grown through the governor to the
// step's row before the step runs (a refusal is a *GrowError within the
// caller's deadline, and the step's growth is undone); KVPreallocated
// commits the maximum up front, and KVConcat is the past/present way,
// where ONNX Runtime allocates and copies the cache every step. Each Run
// records a fence on the cache's handles, so that Sequence.Close, from any
// goroutine, releases them only once the Run in flight has returned.
//
// Sequence.Prefill runs a prompt in one Run (or in Runs of
// DecoderOptions.PrefillChunk tokens): input_ids [1, n], the mask or
// lengths of past + n tokens, and in KVGrow one growth of every Region to
// the whole prompt's rows before the first Run. It is all or nothing: a
// refused growth, an ended context or a failed Run gives the prompt's
// growth back (KVConcat binds its pasts again) and leaves the sequence as
// it was. Its tokens and logits equal ONNX Runtime's own prefilled run of
// the same file, its tokens those of a Step per token (logits within
// float rounding). BenchmarkPrefill (go test -run '^$' -bench
// '^BenchmarkPrefill$' -benchtime 1x -count 3 .) measured on a 2-core
// machine, on scripts/ort.sh's benchmark-size GenAI decoder (4 layers of
// width 1,024), a 512-token prompt 12x to 13x faster in one Prefill than a
// Step per token (thread CPU time; the goal is 5x; 4.5x to 5.8x on the
// 2-layer test model, whose Runs' fixed cost dominates), and decode in
// KVGrow 0.995x to 1.037x the preallocated share buffer's CPU time;
// TestPrefillBytesInProportion, 0.5 of the preallocated buffer's KV bytes
// charged at 1,024 tokens of 2,048.
//
// Decoder.NewBatch makes a Batch of sequence slots whose caches are one
// tensor per layer, [slots, kv_heads, rows, head_size] (GenAI's layout
// only; others are memapi.ErrUnsupported): in KVGrow one Region in which
// each (sequence, KV head) slab is committed as that sequence grows.
// Batch.NewSequence takes a free slot (its Step and Prefill run alone over
// its slot, so a prompt is prefilled alone); Batch.Step runs one token of
// each of several of its sequences in one Run of batch n (input_ids
// [n, 1], attention_mask [n, total] right-padded with zeros, or seqlens_k
// [n] and total_sequence_length the longest; a Run per run of contiguous
// slots), all or nothing; Sequence.Close decommits that sequence's slabs
// only and frees its slot. Each sequence's tokens and logits equal those
// of the same sequence alone (TestBatchDecode: difference 0).
// BenchmarkBatchDecode (go test -run '^$' -bench '^BenchmarkBatchDecode$'
// -benchtime 1x -count 3 .) measured on a 2-core machine 8 sequences in
// one Run per step at 4.3x to 4.6x the tokens per second of one Run each
// on the benchmark-size decoder (thread CPU time; the goal is 3x), 2.2x to
// 2.4x on the test model.
//
// NewDecoder reads the model's Layout as it was exported, with symbolic
// batch and sequence dimensions: memgen's per-head decoder (past_key.L.G),
// ONNX Runtime GenAI's model builder's (past_key_values.N.key/.value
// [batch, kv_heads, past, head_size] read and written by one
// GroupQueryAttention node per layer with a share buffer; attention_mask,
// or seqlens_k and total_sequence_length), and Hugging Face Optimum's
// decoder with past (the same names, concatenated in the graph; with
// position_ids), which decodes in KVConcat only. For GenAI's layout each
// layer's keys (and values) are one tensor [1, kv_heads, rows, head_size]
// bound once over one Region, in which each KV head's range is committed
// as tokens arrive (pmm.Region.Commit), or over one Buffer
// (KVPreallocated). A model of no layout is refused before ONNX Runtime
// loads it with a *LayoutError naming the input or output and what the
// layout expected.
//
// An idle KVGrow sequence sleeps (Sequence.Sleep): its KV cache's bytes
// move to a host tier (a binding on another authority) and the device's
// backing is given back, every address kept; Sequence.Wake puts them back
// and the sequence decodes on with the same logits, bit for bit.
//
// PlanDecoder sizes a decoder and its sequences before any byte is
// committed, from the model's graph alone (ONNX Runtime need not be
// loaded): the weights, the KV cache per token and at full context, the
// compute its workspace takes and the protobuf while it loads; its Need
// is what a shared ledger (governor/xproc) is asked for. WarmUp makes and
// runs a one-node session, so that the runtime's own start is behind a
// caller's memory baseline.
//
// Sessions and tensors come from github.com/yalue/onnxruntime_go: Init loads
// the library through it and opens the same library for the bridge, which
// asks for C API version 24 (ORT_API_VERSION, served by ONNX Runtime
// 1.30.0). The bridge declares the part of the C API it uses itself, in
// ortapi.h; ortapi_test.go holds those declarations to onnxruntime_go's
// onnxruntime_c_api.h (slot offsets and types, OrtAllocator's layout, enum
// values).
//
// This package is a nested Go module so that memgen's core module stays
// free of cgo and of ONNX Runtime; `make ort` fetches the runtime and the
// ONNX conformance models, `make ort-test` runs this module's tests.
package ort
