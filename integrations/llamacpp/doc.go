// Package llamacpp runs llama.cpp (unpatched, its prebuilt CPU libraries)
// with its weights and KV cache in memory that memgen governs.
//
// A ggml backend device of memgen's own (device.c: the CPU device's
// behaviour, init_backend delegating to the CPU backend, with a buffer type
// of its own that is host memory) is handed to llama.cpp through the public
// llama_model_params.devices, every layer offloaded to it: llama.cpp then
// allocates the layers' weights and every context's KV cache from that
// buffer type. The weights (and, through a tensor override, the token
// embeddings) are pmm.Regions committed whole (pmm.Buffers on a device
// without VirtualBacking) of a binding charged to the holder
// Name+"/weights". A context's KV buffer is a pmm.Region reserved for its
// size and never committed, and each KV tensor placed in it is pointed, by
// the buffer's init_tensor, at a pmm.Region of its own, reserved for all
// n_ctx rows and committed for none. Each context is a governor holder of
// its own (Name+"/ctx<N>"); the compute and output buffers llama.cpp makes
// for it come from the device's host buffer type and are pmm.Buffers
// charged to that holder (role "compute"), committed whole. Before the first llama_decode of a Decode the
// context's regions grow, through the governor and within the caller's
// deadline, to the rows the call's decodes touch, and after the last they
// hold exactly its cells; llama.cpp touches no other row (the tests commit
// one row short and watch the engine fault). Flash attention is on, so K
// and V both hold one row per cell and the rows in use are a prefix of
// each tensor.
//
// Over budget, a decode fails with an *OverBudgetError carrying the
// figures, and the sequence is as before. Under pressure the governor asks
// the contexts' holders; a context gives up sequences one at a time until
// the ticket's bytes are freed (finished ones first, then the most KV;
// a DecodeBatch that must commit more first reserves its room, so that
// the context gives up the sequences it does not name), each by its
// policy (ContextOptions.Preempt): offloaded (its rows of every KV tensor
// move to a host tier, ContextOptions.OffloadTo, its cells kept, and the
// next call that names it copies them back) or recomputed (its cells
// dropped, its ranges decommitted behind the decode fences and refunded,
// its tokens decoded again by the next call that names it). Reset and
// Close release the regions the same way.
//
// An idle model sleeps, every address kept. At level 1 (Model.Sleep) the
// bytes of its weights and of every context's KV cache move to a host
// tier (a binding on another authority) and the device backing is
// decommitted; Model.Wake puts them back and the engine decodes on where
// it was, its tokens those of an uninterrupted run. At level 2
// (Model.SleepLevel) the weights are decommitted with nothing copied, and
// Wake commits them again and reads each tensor from the model file (the
// GGUF, at its offset) straight into its place; the finished sequences'
// cells (Context.FinishSeq) are discarded, and a running sequence's KV
// cache moves as at level 1. A weight whose bytes in memory are not the
// file's is moved instead of discarded, and a model file that changed
// since the load fails the sleep or the wake (*ModelFileError). Asleep,
// the calls that would touch the moved or discarded bytes fail with
// ErrAsleep. A Server sleeps its idle model after a while
// (ServerOptions.SleepAfter) or when the governor asks the weights for
// memory (ServerOptions.SleepOnPressure, with Options.SleepOnPressure: on
// a shared ledger, another process's want), and the next request wakes
// it. Options.OnMemoryEvent is told of every sleep, wake, KV offload and
// restore (ReportMemoryEvents records them in a memory report).
//
// A context decodes many sequences together (ContextOptions.Sequences,
// DecodeBatch), each in a KV stream of its own. Server serves a context
// over an OpenAI-style HTTP API (Handler): one sequence per request,
// admission by free sequence and KV budget, and steps arranged so that a
// request's arithmetic does not depend on its neighbours (each prompt in a
// call of its own, the decode tokens highest sequence first), so that its
// greedy tokens are the same whatever else runs; a greedy token's logit
// and the runner-up's come back with it (TopLogits). PlanContext sizes a
// model and a context before any byte is committed, and CheckLedger holds
// the plan against a shared ledger (governor/xproc).
//
// llama.cpp is loaded with dlopen (Init), so building and vetting the
// package needs no library; the bridge calls it through the project's own
// declarations (llamaapi.h), which llamaapi_test.go holds to the release's
// llama.h and ggml-backend-impl.h. Options.Stock loads a model the way
// llama.cpp does on its own (the tests' and benchmarks' baseline).
//
// This package is a nested Go module so that memgen's core module stays
// free of cgo and of llama.cpp; `make llamacpp` fetches the library and
// writes the test model, `make llamacpp-test` runs this module's tests.
package llamacpp
