#include "textflag.h"

// cTrampoline calls a C function with up to six integer arguments, on the
// system stack (runtime.cgocall's asmcgocall jumps here with DI = the
// *cArgs). It loads the arguments into the System V registers, calls fn and
// stores its result in the block. The frame (BP saved and set by the
// assembler) keeps the stack walkable for profilers, and with the 16 bytes
// below it SP stays 16-byte aligned for the call.
//
// struct cArgs { uintptr fn, a1, a2, a3, a4, a5, a6, r; }
TEXT cTrampoline<>(SB), NOSPLIT, $16
	MOVQ BX, 0(SP) // callee-saved in the C ABI
	MOVQ DI, BX
	MOVQ 8(BX), DI
	MOVQ 16(BX), SI
	MOVQ 24(BX), DX
	MOVQ 32(BX), CX
	MOVQ 40(BX), R8
	MOVQ 48(BX), R9
	MOVQ 0(BX), AX
	CALL AX
	MOVQ AX, 56(BX)
	MOVQ 0(SP), BX
	RET

GLOBL ·cTrampolineABI0(SB), NOPTR|RODATA, $8
DATA ·cTrampolineABI0(SB)/8, $cTrampoline<>(SB)
