module github.com/memgen/memgen/integrations/ort

go 1.26.0

require (
	github.com/memgen/memgen v0.1.0
	github.com/yalue/onnxruntime_go v1.27.0
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/sys v0.50.0 // indirect

// In this repository the core is the checkout itself (go.work says the
// same); a module that depends on integrations/ort gets the core version
// above.
replace github.com/memgen/memgen => ../..
