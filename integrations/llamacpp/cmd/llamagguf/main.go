// Command llamagguf writes the llama-architecture GGUF models the llama.cpp
// integration's tests and benchmarks run, with random weights from a fixed
// seed: the tiny model (gguf.TinyShape, F32, no tokenizer), or with -vocab
// the GQA model (gguf.GQAShape, F16) carrying the tokenizer of a
// vocabulary-only GGUF file and the chat template "llama2" (with -q8 its
// matrices quantized to Q8_0; with -large gguf.LargeShape, about 1.1 GiB);
// and it checks any GGUF file.
//
//	llamagguf -o tiny.gguf [-seed 1]
//	llamagguf -vocab ggml-vocab-llama-spm.gguf -o gqa.gguf [-seed 1] [-q8 | -large]
//	llamagguf -check model.gguf
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/memgen/memgen/integrations/llamacpp/gguf"
)

func main() {
	out := flag.String("o", "", "write the tiny model to this file")
	seed := flag.Uint64("seed", 1, "the weights' random seed")
	check := flag.String("check", "", "check this GGUF file and print its shape")
	vocab := flag.String("vocab", "", "write the GQA model (F16) with the tokenizer of this vocabulary-only GGUF file")
	q8 := flag.Bool("q8", false, "with -vocab: the GQA model's matrices in Q8_0")
	large := flag.Bool("large", false, "with -vocab: the large shape (gguf.LargeShape, about 1.1 GiB, F16)")
	flag.Parse()
	if (*q8 || *large) && *vocab == "" || *q8 && *large {
		fmt.Fprintln(os.Stderr, "llamagguf: -q8 and -large go with -vocab, and not together")
		os.Exit(2)
	}
	switch {
	case *check != "":
		in, err := gguf.Check(*check)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llamagguf:", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s, %d tensors, %d bytes\n", *check, in.String("general.architecture"), len(in.Tensors), in.Size)
	case *out != "" && *vocab != "":
		tok, n, err := gguf.Tokenizer(*vocab)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llamagguf:", err)
			os.Exit(1)
		}
		s := gguf.GQAShape
		if *large {
			s = gguf.LargeShape
		}
		s.Q8_0 = *q8
		s.Vocab = n
		// The vocabulary is Llama 2's: so is the chat format (a name
		// llama_chat_apply_template knows).
		tok = append(tok, gguf.KV{Key: "tokenizer.chat_template", Value: "llama2"})
		kvs, ts := gguf.Model(s, *seed, tok)
		if err := gguf.WriteFile(*out, kvs, ts); err != nil {
			fmt.Fprintln(os.Stderr, "llamagguf:", err)
			os.Exit(1)
		}
	case *out != "":
		kvs, ts := gguf.Tiny(gguf.TinyShape, *seed)
		if err := gguf.WriteFile(*out, kvs, ts); err != nil {
			fmt.Fprintln(os.Stderr, "llamagguf:", err)
			os.Exit(1)
		}
	default:
		flag.Usage()
		os.Exit(2)
	}
}
