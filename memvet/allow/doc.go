// Package allow defines an Analyzer that checks that every memvet escape
// carries its reason.
//
// # Analyzer memvetallow
//
// memvetallow: report //memvet:allow escapes that carry no reason
//
// Every memvet analyzer stays silent on a line that carries, or follows, a
// comment
//
//	//memvet:allow <reason>
//
// The reason is required: it is what a reviewer reads instead of the
// finding. An escape without one silences nothing, and this analyzer
// reports it, so that "//memvet:allow" alone can never hide a finding.
package allow
