package ort

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
)

// Layout is the interface of a decoder model: the names, element types and
// shapes of its inputs and outputs and how its attention treats the KV
// cache. NewDecoder and PlanDecoder read it from the model as it was
// exported; nothing is renamed, split or fixed by the user.
type Layout int

const (
	// LayoutPerHead is the layout scripts/ort.sh's own decoder has: inputs
	// input_ids, seqlens_k, total_sequence_length and past_key.L.G /
	// past_value.L.G (float [1, 1, rows, head_size]: one KV head of layer
	// L per tensor), each the past of a com.microsoft::GroupQueryAttention
	// node with kv_num_heads 1 whose present is present_key.L.G /
	// present_value.L.G; output logits.
	LayoutPerHead Layout = iota
	// LayoutGenAI is ONNX Runtime GenAI's model builder's: inputs
	// input_ids and either attention_mask (the graph computes
	// GroupQueryAttention's seqlens_k and total_sequence_length from it) or
	// seqlens_k and total_sequence_length; past_key_values.N.key /
	// past_key_values.N.value (float [batch, kv_heads, past, head_size]),
	// each the past of layer N's GroupQueryAttention node, whose present
	// is present.N.key / present.N.value; output logits. Past and present
	// share one buffer of the maximum length (GenAI's
	// past_present_share_buffer).
	LayoutGenAI
	// LayoutOptimum is Hugging Face Optimum's decoder with past: inputs
	// input_ids, attention_mask, position_ids (optional in older exports)
	// and past_key_values.N.key / .value (float [batch, kv_heads, past,
	// head_size]), which the graph concatenates with the step's keys and
	// values into present.N.key / .value (past + 1 rows): no
	// GroupQueryAttention node reads them, and every step's present is a
	// new tensor. Such a model decodes in KVConcat mode only.
	LayoutOptimum
)

func (l Layout) String() string {
	switch l {
	case LayoutPerHead:
		return "per-head share buffer (past_key.L.G)"
	case LayoutGenAI:
		return "ONNX Runtime GenAI share buffer (past_key_values.N.*, GroupQueryAttention)"
	case LayoutOptimum:
		return "Optimum concat (past_key_values.N.* → present.N.*)"
	}
	return "Layout(" + strconv.Itoa(int(l)) + ")"
}

// LayoutError refuses a model whose inputs or outputs fit none of the
// layouts a Decoder reads (LayoutPerHead, LayoutGenAI, LayoutOptimum):
// Name is the input or output at fault and Want what the layout expected
// of it. It matches memapi.ErrUnsupported.
type LayoutError struct {
	Name string // the input or output
	Want string // what the layout expects
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("ort: %s: %s", e.Name, e.Want)
}

// Unwrap reports memapi.ErrUnsupported.
func (e *LayoutError) Unwrap() error { return memapi.ErrUnsupported }

// The names the layouts share.
const (
	inIDs       = "input_ids"
	inSeqlens   = "seqlens_k"
	inTotal     = "total_sequence_length"
	inMask      = "attention_mask"
	inPos       = "position_ids"
	outLogits   = "logits"
	pastPrefix  = "past_"            // LayoutPerHead: past_key.L.G
	presPrefix  = "present_"         // present_key.L.G
	pkvPrefix   = "past_key_values." // LayoutGenAI, LayoutOptimum: past_key_values.N.key
	pkvPresents = "present."         // present.N.key
)

const elemInt64, elemInt32 = 7, 6

// kvSlot is one cache tensor: the keys or values of one layer (of one KV
// head in LayoutPerHead, of all of them otherwise).
type kvSlot struct {
	past, present string // the input's and the output's names
	in, out       int    // their indexes
	layer         int
	kvHead        int // LayoutPerHead's G; 0 otherwise
	isValue       bool
}

// ioLayout is what a decoder's model declares, read by readLayout: the
// indexes of its inputs (-1 when absent) and outputs, the rank of the
// length inputs, and the cache tensors.
type ioLayout struct {
	layout                         Layout
	ids, mask, pos, seqlens, total int
	seqlensRank, totalRank         int
	logits, vocab                  int
	kvHeads, headSize              int // KV heads per cache tensor, the head size
	slots                          []kvSlot
	// oneToken: input_ids or logits declares a length of 1, so a Run
	// takes one token (a prompt runs token by token).
	oneToken bool
	// batchOne: an input or output declares a batch of 1 (not symbolic),
	// so a Run takes one sequence.
	batchOne bool
}

// dimOne reports whether a declared dimension takes one (a batch or a
// step of one token): 1, or symbolic (-1).
func dimOne(d int64) bool { return d == 1 || d == -1 }

// readLayout reads the layout of a model from its declared inputs and
// outputs (the session's, or the graph's for a plan) and its graph's
// GroupQueryAttention nodes. Whatever fits no layout is a *LayoutError
// naming the input or output and what was expected; a node contradicting
// its tensors, or a rotary cache shorter than maxSeq (when maxSeq > 0), a
// *LimitError.
func readLayout(ins, outs []valueInfo, g *graph, maxSeq int) (*ioLayout, error) {
	l := &ioLayout{ids: -1, mask: -1, pos: -1, seqlens: -1, total: -1, logits: -1}
	outIdx := map[string]int{}
	for i, o := range outs {
		outIdx[o.name] = i
	}
	const expectIn = "not an input of the layouts a Decoder reads (input_ids, attention_mask, position_ids, seqlens_k, total_sequence_length, past_key.L.G / past_value.L.G, past_key_values.N.key / .value)"
	var perHead, exported string // the first cache input of each naming
	for i, in := range ins {
		switch {
		case in.name == inIDs || in.name == inMask || in.name == inPos:
			if in.elem != elemInt64 || len(in.dims) != 2 || !dimOne(in.dims[0]) {
				return nil, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("element type %d, shape %v; want int64 (7) [batch, length]", in.elem, in.dims)}
			}
			switch in.name {
			case inIDs:
				l.ids = i
				l.oneToken = l.oneToken || in.dims[1] == 1
			case inMask:
				l.mask = i
			default:
				l.pos = i
				l.oneToken = l.oneToken || in.dims[1] == 1
			}
		case in.name == inSeqlens:
			if in.elem != elemInt32 || len(in.dims) < 1 || len(in.dims) > 2 || !dimOne(in.dims[0]) || len(in.dims) == 2 && !dimOne(in.dims[1]) {
				return nil, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("element type %d, shape %v; want int32 (6) [batch] or [batch, 1]", in.elem, in.dims)}
			}
			l.seqlens, l.seqlensRank = i, len(in.dims)
		case in.name == inTotal:
			if in.elem != elemInt32 || len(in.dims) > 1 || len(in.dims) == 1 && !dimOne(in.dims[0]) {
				return nil, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("element type %d, shape %v; want int32 (6) [] or [1]", in.elem, in.dims)}
			}
			l.total, l.totalRank = i, len(in.dims)
		case strings.HasPrefix(in.name, pkvPrefix) || strings.HasPrefix(in.name, pastPrefix):
			read := l.perHeadSlot
			if strings.HasPrefix(in.name, pkvPrefix) {
				read = l.exportedSlot
				exported = cmp.Or(exported, in.name)
			} else {
				perHead = cmp.Or(perHead, in.name)
			}
			if perHead != "" && exported != "" {
				return nil, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("mixed layouts: %s is a per-head cache (past_key.L.G), %s an exported one (past_key_values.N.*); one model has one layout", perHead, exported)}
			}
			sl, err := read(i, in, outs, outIdx)
			if err != nil {
				return nil, err
			}
			l.slots = append(l.slots, sl)
		default:
			return nil, &LayoutError{Name: "input " + in.name, Want: expectIn}
		}
	}
	if l.ids < 0 {
		return nil, &LayoutError{Name: "input " + inIDs, Want: "missing; every layout takes the token as input_ids int64 [batch, length]"}
	}
	if len(l.slots) == 0 {
		return nil, &LayoutError{Name: "inputs", Want: "no KV cache: want past_key.L.G / past_value.L.G (per-head) or past_key_values.N.key / .value (GenAI, Optimum)"}
	}
	if err := l.pairs(); err != nil {
		return nil, err
	}
	presents := map[int]bool{}
	for _, sl := range l.slots {
		presents[sl.out] = true
	}
	for i, o := range outs {
		switch {
		case o.name == outLogits:
			if o.elem != elemFloat || len(o.dims) != 3 || !dimOne(o.dims[0]) || !dimOne(o.dims[1]) || o.dims[2] <= 0 || o.dims[2] > 1<<31 {
				return nil, &LayoutError{Name: "output " + o.name, Want: fmt.Sprintf("element type %d, shape %v; want float [batch, length, vocab]", o.elem, o.dims)}
			}
			l.logits, l.vocab = i, int(o.dims[2])
			l.oneToken = l.oneToken || o.dims[1] == 1
		case presents[i]:
		case strings.HasPrefix(o.name, pkvPresents) || strings.HasPrefix(o.name, presPrefix):
			return nil, &LayoutError{Name: "output " + o.name, Want: "a present without its past input"}
		default:
			return nil, &LayoutError{Name: "output " + o.name, Want: "not an output of the layouts a Decoder reads (logits and the cache's presents)"}
		}
	}
	if l.logits < 0 {
		return nil, &LayoutError{Name: "output " + outLogits, Want: "missing; want float [batch, length, vocab]"}
	}
	if perHead != "" {
		l.layout = LayoutPerHead
	} else if err := l.classify(g); err != nil {
		return nil, err
	}
	if err := l.checkInputs(); err != nil {
		return nil, err
	}
	for _, x := range [][]valueInfo{ins, outs} {
		for _, v := range x {
			if v.name != inTotal && len(v.dims) > 0 && v.dims[0] == 1 {
				l.batchOne = true
			}
		}
	}
	return l, l.checkNodes(g, maxSeq)
}

// perHeadSlot reads LayoutPerHead's cache input i (past_key.L.G) and
// finds its present.
func (l *ioLayout) perHeadSlot(i int, in valueInfo, outs []valueInfo, outIdx map[string]int) (kvSlot, error) {
	rest := strings.TrimPrefix(in.name, pastPrefix)
	parts := strings.Split(rest, ".")
	bad := &LayoutError{Name: "input " + in.name, Want: "want past_key.LAYER.HEAD or past_value.LAYER.HEAD"}
	if len(parts) != 3 || (parts[0] != "key" && parts[0] != "value") {
		return kvSlot{}, bad
	}
	layer, err1 := strconv.Atoi(parts[1])
	head, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil || layer < 0 || head < 0 || layer > 1<<20 || head > 1<<20 {
		return kvSlot{}, bad
	}
	if in.elem != elemFloat || len(in.dims) != 4 || in.dims[0] != 1 || in.dims[1] != 1 || in.dims[3] <= 0 || in.dims[3]%4 != 0 || in.dims[3] > 1<<20 {
		return kvSlot{}, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("element type %d, shape %v; want float [1 1 rows head_size] (one KV head per tensor, head_size a multiple of 4)", in.elem, in.dims)}
	}
	sl := kvSlot{past: in.name, present: presPrefix + rest, in: i, layer: layer, kvHead: head, isValue: parts[0] == "value"}
	return sl, l.present(&sl, in, 1, outs, outIdx)
}

// exportedSlot reads an exported cache input i (past_key_values.N.key or
// .value) and finds its present.
func (l *ioLayout) exportedSlot(i int, in valueInfo, outs []valueInfo, outIdx map[string]int) (kvSlot, error) {
	rest := strings.TrimPrefix(in.name, pkvPrefix)
	parts := strings.Split(rest, ".")
	bad := &LayoutError{Name: "input " + in.name, Want: "want past_key_values.LAYER.key or past_key_values.LAYER.value"}
	if len(parts) != 2 || (parts[1] != "key" && parts[1] != "value") {
		return kvSlot{}, bad
	}
	layer, err := strconv.Atoi(parts[0])
	if err != nil || layer < 0 || layer > 1<<20 {
		return kvSlot{}, bad
	}
	if in.elem != elemFloat || len(in.dims) != 4 || !dimOne(in.dims[0]) || in.dims[1] <= 0 || in.dims[1] > 1<<16 || in.dims[3] <= 0 || in.dims[3]%4 != 0 || in.dims[3] > 1<<20 {
		return kvSlot{}, &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("element type %d, shape %v; want float [batch kv_heads past head_size] (head_size a multiple of 4)", in.elem, in.dims)}
	}
	sl := kvSlot{past: in.name, present: pkvPresents + rest, in: i, layer: layer, isValue: parts[1] == "value"}
	return sl, l.present(&sl, in, int(in.dims[1]), outs, outIdx)
}

// present finds slot sl's present output and checks both against the
// cache's KV heads and head size so far.
func (l *ioLayout) present(sl *kvSlot, in valueInfo, heads int, outs []valueInfo, outIdx map[string]int) error {
	o, ok := outIdx[sl.present]
	if !ok {
		return &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("a past without present: no output %s", sl.present)}
	}
	sl.out = o
	hs := int(in.dims[3])
	if l.headSize == 0 {
		l.headSize, l.kvHeads = hs, heads
	} else if l.headSize != hs || l.kvHeads != heads {
		return &LayoutError{Name: "input " + in.name, Want: fmt.Sprintf("%d KV heads of size %d; the other cache tensors have %d of size %d", heads, hs, l.kvHeads, l.headSize)}
	}
	pd := outs[o].dims
	if outs[o].elem != elemFloat || len(pd) != 4 || !dimOne(pd[0]) || pd[1] != in.dims[1] || pd[3] != in.dims[3] {
		return &LayoutError{Name: "output " + sl.present, Want: fmt.Sprintf("element type %d, shape %v; want float of its past's %v (batch, KV heads, rows, head size)", outs[o].elem, pd, in.dims)}
	}
	return nil
}

// pairs checks that every layer (and KV head) has both its keys and its
// values.
func (l *ioLayout) pairs() error {
	type at struct{ layer, head int }
	keys, vals := map[at]string{}, map[at]string{}
	for _, sl := range l.slots {
		k := at{sl.layer, sl.kvHead}
		m := keys
		if sl.isValue {
			m = vals
		}
		if _, dup := m[k]; dup {
			return &LayoutError{Name: "input " + sl.past, Want: "a second cache input for the same layer and head"}
		}
		m[k] = sl.past
	}
	for k, name := range keys {
		if _, ok := vals[k]; !ok {
			return &LayoutError{Name: "input " + name, Want: "keys without values: no value cache of the same layer"}
		}
	}
	for k, name := range vals {
		if _, ok := keys[k]; !ok {
			return &LayoutError{Name: "input " + name, Want: "values without keys: no key cache of the same layer"}
		}
	}
	return nil
}

// gqaOf returns the com.microsoft::GroupQueryAttention node that reads
// slot sl's past as its past key (input 3) or past value (4) and writes
// its present as the matching present (output 1 or 2), or nil.
func gqaOf(g *graph, sl kvSlot) *node {
	in, out := 3, 1
	if sl.isValue {
		in, out = 4, 2
	}
	for k := range g.nodes {
		n := &g.nodes[k]
		if n.op == "GroupQueryAttention" && n.domain == "com.microsoft" && len(n.inputs) > in && n.inputs[in] == sl.past &&
			len(n.outs) > out && n.outs[out] == sl.present {
			return n
		}
	}
	return nil
}

// classify tells an exported layout by its attention: every cache
// tensor read and written by a GroupQueryAttention node (GenAI's share
// buffer), or none (Optimum's concat).
func (l *ioLayout) classify(g *graph) error {
	var fed, unfed string
	for _, sl := range l.slots {
		if gqaOf(g, sl) != nil {
			if fed == "" {
				fed = sl.past
			}
		} else if unfed == "" {
			unfed = sl.past
		}
	}
	switch {
	case unfed == "":
		l.layout = LayoutGenAI
	case fed == "":
		l.layout = LayoutOptimum
	default:
		return &LayoutError{Name: "input " + unfed, Want: fmt.Sprintf("mixed layouts: it is the past and its present the output of no GroupQueryAttention node, while %s is (GenAI's layout wants every cache tensor in a GroupQueryAttention node, Optimum's none)", fed)}
	}
	return nil
}

// checkInputs checks the small inputs against the layout.
func (l *ioLayout) checkInputs() error {
	switch l.layout {
	case LayoutPerHead:
		for _, x := range []struct {
			i    int
			name string
		}{{l.mask, inMask}, {l.pos, inPos}} {
			if x.i >= 0 {
				return &LayoutError{Name: "input " + x.name, Want: "the per-head layout takes seqlens_k and total_sequence_length, not " + x.name}
			}
		}
		if l.seqlens < 0 || l.total < 0 {
			return &LayoutError{Name: "input " + inSeqlens, Want: "the per-head layout needs seqlens_k and total_sequence_length"}
		}
	case LayoutGenAI:
		if l.mask < 0 && (l.seqlens < 0 || l.total < 0) {
			return &LayoutError{Name: "input " + inMask, Want: "GenAI's layout needs attention_mask, or seqlens_k and total_sequence_length"}
		}
	case LayoutOptimum:
		if l.mask < 0 {
			return &LayoutError{Name: "input " + inMask, Want: "Optimum's layout needs attention_mask int64 [batch, past + length]"}
		}
		for _, x := range []struct {
			i    int
			name string
		}{{l.seqlens, inSeqlens}, {l.total, inTotal}} {
			if x.i >= 0 {
				return &LayoutError{Name: "input " + x.name, Want: "Optimum's concat layout has no GroupQueryAttention to take " + x.name}
			}
		}
	}
	return nil
}

// checkNodes checks the GroupQueryAttention nodes that read the cache
// (LayoutPerHead, LayoutGenAI) against the tensors: every cache tensor is
// the past of one, whose kv_num_heads is the tensor's KV heads, and a node
// with rotary embedding (do_rotary 1) has a cos_cache initializer of at
// least maxSeq rows (positions past it have no rotation; maxSeq 0 skips
// this) and at most head_size/2 columns. A cos_cache computed in the graph
// is not checked.
func (l *ioLayout) checkNodes(g *graph, maxSeq int) error {
	if l.layout == LayoutOptimum {
		return nil
	}
	for _, sl := range l.slots {
		n := gqaOf(g, sl)
		if n == nil {
			return &LayoutError{Name: "input " + sl.past, Want: fmt.Sprintf("feeds no com.microsoft::GroupQueryAttention node writing %s (the %v)", sl.present, l.layout)}
		}
		if kv := n.ints["kv_num_heads"]; kv != int64(l.kvHeads) {
			reason := fmt.Sprintf("the node reading %s has kv_num_heads %d, its tensor %d KV heads", sl.past, kv, l.kvHeads)
			if l.layout == LayoutPerHead {
				reason = fmt.Sprintf("the node reading %s keeps several KV heads in one cache tensor, whose rows in use are then no prefix", sl.past)
			}
			return &LimitError{Field: "kv_num_heads", Value: kv, Limit: int64(l.kvHeads), Reason: reason}
		}
		if n.ints["do_rotary"] != 1 || len(n.inputs) < 8 {
			continue
		}
		dims, ok := g.dims[n.inputs[7]]
		if !ok || len(dims) != 2 {
			continue
		}
		if int64(maxSeq) > dims[0] {
			return &LimitError{Field: "MaxSeq", Value: int64(maxSeq), Limit: dims[0],
				Reason: fmt.Sprintf("the rotary cache %s has rows for %d positions", n.inputs[7], dims[0])}
		}
		if 2*dims[1] > int64(l.headSize) {
			return &LimitError{Field: "head_size", Value: int64(l.headSize), Limit: 2 * dims[1],
				Reason: fmt.Sprintf("%s declares head size %d, but the rotary cache %s rotates %d dimensions", sl.past, l.headSize, n.inputs[7], 2*dims[1])}
		}
	}
	return nil
}

// declaredInputs is the graph's inputs less initializers listed as inputs
// (older exports list them): the inputs a session has.
func declaredInputs(g *graph) []valueInfo {
	var ins []valueInfo
	for _, in := range g.inputs {
		if _, init := g.dims[in.name]; !init {
			ins = append(ins, in)
		}
	}
	return ins
}
