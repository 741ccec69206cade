// Command llamagguf writes the tiny llama-architecture GGUF model the
// llama.cpp integration's tests and benchmarks run (gguf.TinyShape, random
// F32 weights from a fixed seed), and checks any GGUF file.
//
//	llamagguf -o tiny.gguf [-seed 1]
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
	flag.Parse()
	switch {
	case *check != "":
		in, err := gguf.Check(*check)
		if err != nil {
			fmt.Fprintln(os.Stderr, "llamagguf:", err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s, %d tensors, %d bytes\n", *check, in.String("general.architecture"), len(in.Tensors), in.Size)
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
