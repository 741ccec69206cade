// Package memreport turns a governor's ledger into a memory report: a
// self-contained HTML page that opens with the verdict of the program's
// checks (Recorder.Check), then its tables (Recorder.Table: a comparison
// with baselines), then the checks one by one, then a timeline of every
// authority's ledger
// (one stacked area per holder, labelled with its role, its cache paler
// above the rest of its charge when it reports one, the bytes pending
// free and reserved on top, the capacity as a line, events marked) that the
// page's script redraws at the window's width with zoom, pan, a cursor
// readout and holder toggles; per authority a table of each holder's peak,
// mean and final bytes (the final split into in use, cached and
// quarantined) and a table of its events (tickets with the holder
// asked, the bytes wanted and freed and the time to answer; pressure;
// the program's own events such as offloads and preemptions) linked to the
// chart; a versioned JSON snapshot of the same data (report.schema.json
// describes it); and a Chrome trace-event export for ui.perfetto.dev and
// chrome://tracing.
//
// Any program that runs a governor can write one:
//
//	rec := memreport.New(memreport.Options{Title: "my server"})
//	g := governor.New(governor.Options{OnEvent: rec.Event}) // every event kind
//	...
//	rec.Sample(g.Snapshot()) // at each step, or on a timer
//	rec.Annotate(memreport.Annotation{...}) // the program's own events
//	rec.Check("ledger identity", failures == 0, "0 failures in 812 audits")
//	rec.Span("request 7", "request", start, end) // for the trace export
//	...
//	rec.End(g.Snapshot()) // the ledger the tables show, before closing
//	rec.WriteHTML(f)
//
// Samples are taken at the snapshot's time (the governor's Clock, so a
// simulation on simulated time gets a simulated time axis). A Recorder keeps
// at most Options.MaxPoints samples per authority: when it is full it drops
// every other sample and from then on keeps one sample in two (and so on),
// so a long run costs bounded memory while every point it keeps is exactly
// a snapshot the program took. The last sample is always kept. Events are
// bounded the same way (Options.MaxEvents), and every event is counted.
// The per-holder figures are exact over every sample offered.
//
// The HTML has no external scripts, styles or fonts and is well-formed XML
// (XHTML syntax), so tools can parse it and headless browsers render it
// offline; without its script it shows the charts as drawn in Go.
package memreport
