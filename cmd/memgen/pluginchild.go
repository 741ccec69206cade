package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
	"github.com/memgen/memgen/mechanisms/plugin"
)

// The child process of plugin-check: the memgen binary itself, run with
// childEnv naming the pass and skipEnv the subtests not to run. It loads
// the plugin, runs one pass of the suite and reports to the parent as it
// goes, one JSON event per line on its standard output. It is the only
// process that loads the plugin, so a plugin that crashes or hangs takes
// down this child, never plugin-check.
const (
	childEnv = "MEMGEN_PLUGIN_CHECK_CHILD"
	skipEnv  = "MEMGEN_PLUGIN_CHECK_SKIP"
)

// exitStuck is the child's exit status after a call that did not return.
const exitStuck = 3

// heartbeat is how often an idle child says it is alive.
const heartbeat = time.Second

// event is one line the child writes. Ev is one of:
//
//	plugin   Line describes the plugin (its descriptor and instance)
//	refused  Line says why the plugin did not load
//	start    subtest Test started
//	end      subtest Test ended (Failed, Skipped, Leaf)
//	stuck    a call into slot Slot had not returned within Bound, in subtest Test
//	done     the pass ended: Leaves, Failures, SkippedNames and the report of the failures
//	alive    the heartbeat
type event struct {
	Ev           string        `json:"ev"`
	Line         string        `json:"line,omitempty"`
	Test         string        `json:"test,omitempty"`
	Failed       bool          `json:"failed,omitempty"`
	Skipped      bool          `json:"skipped,omitempty"`
	Leaf         bool          `json:"leaf,omitempty"`
	Slot         string        `json:"slot,omitempty"`
	Bound        time.Duration `json:"bound,omitempty"`
	Leaves       int           `json:"leaves,omitempty"`
	Failures     []string      `json:"failures,omitempty"`
	SkippedNames []string      `json:"skipped_names,omitempty"`
	Report       string        `json:"report,omitempty"`
}

// pass is one run of the suite over fresh instances.
type pass struct {
	name    string
	wrapped bool   // through the checked wrapper in verify mode
	verify  bool   // the loader's verify mode (serializes mutating calls)
	only    string // when set, only the subtests under this prefix run
}

// passes are plugin-check's runs: the whole suite bare and checked, both in
// verify mode, then the concurrency subtests with verification off, where
// nothing serializes the plugin's calls and an unsynchronized plugin shows
// in its results.
var passes = []pass{
	{name: "bare", verify: true},
	{name: "checked", wrapped: true, verify: true},
	{name: "concurrency", only: "concurrency/"},
}

func passNamed(name string) (pass, bool) {
	for _, p := range passes {
		if p.name == name {
			return p, true
		}
	}
	return pass{}, false
}

// emitter writes events, one write per line, from any goroutine.
type emitter struct {
	mu sync.Mutex
	w  io.Writer
}

func (e *emitter) emit(ev event) {
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err) // every field marshals
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
}

// running tracks the subtest that is running (subtests run one at a time).
type running struct {
	mu   sync.Mutex
	name string
}

func (r *running) start(name string) {
	r.mu.Lock()
	r.name = name
	r.mu.Unlock()
}

func (r *running) end(name string) {
	r.mu.Lock()
	r.name = ""
	if i := strings.LastIndex(name, "/"); i >= 0 {
		r.name = name[:i]
	}
	r.mu.Unlock()
}

func (r *running) get() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.name
}

// slotBudget is the deadline consuming slots and the suite's calls get: a
// fifth below the watchdog's bound, so that a slot honouring deadline_ns
// returns before the watchdog reports it.
func slotBudget(bound time.Duration) time.Duration { return bound - bound/5 }

// runPluginCheckChild runs pass p on the plugin at path and reports on out.
func runPluginCheckChild(o *options, path, passName string, out io.Writer) int {
	em := &emitter{w: out}
	p, ok := passNamed(passName)
	if !ok {
		em.emit(event{Ev: "refused", Line: fmt.Sprintf("unknown pass %q", passName)})
		return exitUsage
	}
	var skip []string
	if s := os.Getenv(skipEnv); s != "" {
		skip = strings.Split(s, "\n")
	}
	var cur running
	watch, err := plugin.NewWatchdog(o.callBound, func(s plugin.Stuck) {
		em.emit(event{Ev: "stuck", Test: cur.get(), Slot: s.Slot, Bound: s.Bound})
		os.Exit(exitStuck) // the call cannot be preempted: the child ends here
	})
	if err != nil {
		em.emit(event{Ev: "refused", Line: err.Error()})
		return exitUsage
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				em.emit(event{Ev: "alive"})
			}
		}
	}()

	loading := watch.Watch(memapi.MechanismID(filepath.Base(path)), "the library's loading and entry point")
	l, err := plugin.Open(path)
	loading.Stop()
	if err != nil {
		em.emit(event{Ev: "refused", Line: err.Error()})
		return exitSpec
	}
	opts := plugin.Options{Config: o.config, Verify: p.verify, Watchdog: watch, GuardPages: true,
		SlotTimeout: slotBudget(o.callBound), Logger: slog.New(slog.DiscardHandler)}
	probe, err := l.New(opts)
	if err != nil {
		em.emit(event{Ev: "refused", Line: err.Error()})
		return exitSpec
	}
	info := probe.Info()
	if err := probe.Close(); err != nil {
		em.emit(event{Ev: "refused", Line: err.Error()})
		return exitSpec
	}
	em.emit(event{Ev: "plugin", Line: fmt.Sprintf("plugin %s: ABI %d.%d, %v device %d, offers %v, alloc granularity %d, granularity %d, config %q",
		l.Name, l.Version>>16, l.Version&0xffff, l.Device.Kind, info.Device.Ordinal, l.Offers(), info.AllocGranularity, info.Granularity, o.config)})

	d := l.Declaration()
	factory := func(t conformance.T) conformance.Subject {
		if slices.Contains(skip, t.Name()) {
			t.Skipf("not run: it crashed or hung the check in an earlier run")
		}
		if p.only != "" && !strings.HasPrefix(t.Name(), p.only) {
			t.Skipf("not in the %s pass", p.name)
		}
		m, err := l.New(opts)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c, err := m.NewContext()
		if err != nil {
			_ = m.Close()
			t.Fatalf("the plugin has no device context, which the suite reads and writes memory through: %v", err)
		}
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("closing the context: %v", err)
			}
			if err := m.Close(); err != nil {
				t.Errorf("closing the instance: %v", err)
			}
		})
		var mech memapi.Mechanism = m
		if p.wrapped {
			mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
		}
		return conformance.Subject{Mechanism: mech, Context: c, Declared: &d, HostMapped: l.Device.Kind == memapi.DeviceKindHost,
			OpTimeout: slotBudget(o.callBound)}
	}
	res := conformancetest.RecordWith(factory, conformancetest.Hooks{
		Start: func(name string) {
			cur.start(name)
			em.emit(event{Ev: "start", Test: name})
		},
		End: func(oc conformancetest.Outcome) {
			cur.end(oc.Name)
			em.emit(event{Ev: "end", Test: oc.Name, Failed: oc.Failed, Skipped: oc.Skipped, Leaf: oc.Leaf})
		},
	})
	done := event{Ev: "done", Failures: res.Failed(), Report: res.Report()}
	for _, lf := range res.Leaves() {
		if p.only == "" || strings.HasPrefix(lf.Name, p.only) {
			done.Leaves++
		}
	}
	for _, n := range res.Skipped() {
		if p.only == "" || strings.HasPrefix(n, p.only) {
			done.SkippedNames = append(done.SkippedNames, n)
		}
	}
	em.emit(done)
	return exitOK
}
