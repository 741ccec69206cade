// Package memreport turns a governor's ledger into a memory report: a
// self-contained HTML page with an SVG timeline of every authority's ledger
// (one stacked area per holder, labelled with its role, the bytes pending
// free and reserved on top, the capacity as a line, pressure events marked),
// a table of the final figures, and a JSON snapshot of the same data.
//
// Any program that runs a governor can write one:
//
//	rec := memreport.New(memreport.Options{Title: "my server"})
//	g := governor.New(governor.Options{OnEvent: rec.Event}) // pressure markers
//	...
//	rec.Sample(g.Snapshot()) // at each step, or on a timer
//	...
//	rec.WriteHTML(f)
//
// Samples are taken at the snapshot's time (the governor's Clock, so a
// simulation on simulated time gets a simulated time axis). A Recorder keeps
// at most Options.MaxPoints samples per authority: when it is full it drops
// every other sample and from then on keeps one sample in two (and so on),
// so a long run costs bounded memory while every point it keeps is exactly
// a snapshot the program took. The last sample is always kept.
//
// The HTML has no external scripts, styles or fonts and is well-formed XML
// (XHTML syntax), so tools can parse it and headless browsers render it
// offline.
package memreport
