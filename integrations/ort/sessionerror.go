package ort

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrCode is an ONNX Runtime error code (OrtErrorCode).
type ErrCode int

// The codes of ONNX Runtime's C API.
const (
	CodeFail                   ErrCode = 1
	CodeInvalidArgument        ErrCode = 2
	CodeNoSuchFile             ErrCode = 3
	CodeNoModel                ErrCode = 4
	CodeEngineError            ErrCode = 5
	CodeRuntimeException       ErrCode = 6
	CodeInvalidProtobuf        ErrCode = 7
	CodeModelLoaded            ErrCode = 8
	CodeNotImplemented         ErrCode = 9
	CodeInvalidGraph           ErrCode = 10
	CodeEPFail                 ErrCode = 11
	CodeModelLoadCanceled      ErrCode = 12
	CodeModelRequiresCompiling ErrCode = 13
	CodeNotFound               ErrCode = 14
)

var codeNames = map[ErrCode]string{
	CodeFail: "ORT_FAIL", CodeInvalidArgument: "ORT_INVALID_ARGUMENT", CodeNoSuchFile: "ORT_NO_SUCHFILE",
	CodeNoModel: "ORT_NO_MODEL", CodeEngineError: "ORT_ENGINE_ERROR", CodeRuntimeException: "ORT_RUNTIME_EXCEPTION",
	CodeInvalidProtobuf: "ORT_INVALID_PROTOBUF", CodeModelLoaded: "ORT_MODEL_LOADED", CodeNotImplemented: "ORT_NOT_IMPLEMENTED",
	CodeInvalidGraph: "ORT_INVALID_GRAPH", CodeEPFail: "ORT_EP_FAIL", CodeModelLoadCanceled: "ORT_MODEL_LOAD_CANCELED",
	CodeModelRequiresCompiling: "ORT_MODEL_REQUIRES_COMPILATION", CodeNotFound: "ORT_NOT_FOUND",
}

func (c ErrCode) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "OrtErrorCode " + strconv.Itoa(int(c))
}

// ErrBadModel is what a model file ONNX Runtime cannot load matches: a
// missing graph, a corrupt protobuf, an invalid graph.
var ErrBadModel = errors.New("ort: the model is not one ONNX Runtime can load")

// ErrRuntime is what a failure inside ONNX Runtime matches (a kernel that
// failed, an exception, an execution provider's failure).
var ErrRuntime = errors.New("ort: ONNX Runtime failed")

// SessionError is a failure ONNX Runtime reported: the bridge call, its
// code and its message. errors.Is matches, by code: fs.ErrNotExist (no
// such file), ErrBadModel (no model, invalid protobuf or graph),
// memapi.ErrInvalidRange (an invalid argument: a shape, an index),
// memapi.ErrUnsupported (not implemented), ErrRuntime (the rest).
type SessionError struct {
	Call    string // the bridge's call or ONNX Runtime function
	Code    ErrCode
	Message string
}

func (e *SessionError) Error() string {
	return fmt.Sprintf("%s: %s (%v)", e.Call, e.Message, e.Code)
}

func (e *SessionError) Unwrap() error {
	switch e.Code {
	case CodeNoSuchFile:
		return fs.ErrNotExist
	case CodeNoModel, CodeInvalidProtobuf, CodeInvalidGraph:
		return ErrBadModel
	case CodeInvalidArgument:
		return memapi.ErrInvalidRange
	case CodeNotImplemented:
		return memapi.ErrUnsupported
	}
	return ErrRuntime
}

// parseErr turns a bridge message into an error: "CODE\x1fcall: message"
// is a *SessionError, anything else the bridge's own text.
func parseErr(s string) error {
	code, rest, ok := strings.Cut(s, "\x1f")
	if !ok {
		return errors.New(s)
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		return errors.New(s)
	}
	call, msg, _ := strings.Cut(rest, ": ")
	return &SessionError{Call: call, Code: ErrCode(n), Message: msg}
}
