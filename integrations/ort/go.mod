module github.com/memgen/memgen/integrations/ort

go 1.26.8

replace github.com/memgen/memgen => ../..

require (
	github.com/memgen/memgen v0.0.0
	github.com/yalue/onnxruntime_go v1.27.0
	google.golang.org/protobuf v1.36.12
)

require (
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
