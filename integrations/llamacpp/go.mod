module github.com/memgen/memgen/integrations/llamacpp

go 1.26.0

require (
	github.com/memgen/memgen v0.1.0
	go.uber.org/goleak v1.3.0
)

require golang.org/x/sys v0.50.0 // indirect

// In this repository the core is the checkout itself (go.work says the
// same); a module that depends on integrations/llamacpp gets the core
// version above.
replace github.com/memgen/memgen => ../..
