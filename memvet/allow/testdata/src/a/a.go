package a

//memvet:allow the reason is here, so nothing is reported
var x = 1

/* want `//memvet:allow needs a reason` */ //memvet:allow
var y = 2

//memvet:allowance is another word and not an escape
var z = 3
