package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
	"github.com/memgen/memgen/mechanisms/plugin"
)

func init() {
	commands["plugin-check"] = command{
		help: "Loads the C plugin at PATH.so (usage: memgen plugin-check [flags] PATH.so),\n" +
			"without the spec, and runs the whole conformance suite on fresh instances\n" +
			"of it, bare and through the checked wrapper, with the loader in verify mode:\n" +
			"the spec/... subtests check it against its own descriptor (name, device,\n" +
			"offers, granularity), and a host-memory plugin gets the leak check. Prints\n" +
			"the plugin, each run's counts and every failure with its log; exits 1 when\n" +
			"the plugin does not load or any subtest fails. The command a plugin author\n" +
			"puts in their CI.",
		flags: func(fs *flag.FlagSet, o *options) {
			fs.StringVar(&o.config, "config", "", "the configuration string passed to the plugin's open (key=value,...)")
			fs.BoolVar(&o.verbose, "v", false, "also list the subtests that were skipped")
		},
		run:        runPluginCheck,
		positional: true,
	}
}

func runPluginCheck(o *options, stdout, stderr io.Writer) int {
	if len(o.args) != 1 {
		fmt.Fprintf(stderr, "memgen plugin-check: want one PATH.so, got %q\n", o.args)
		return exitUsage
	}
	path := o.args[0]
	if !strings.Contains(path, "/") {
		path = "./" + path // a file in this directory, not a soname on the search path
	}
	l, err := plugin.Open(path)
	if err != nil {
		fmt.Fprintln(stderr, "memgen plugin-check:", err)
		return exitSpec
	}
	probe, err := l.New(plugin.Options{Config: o.config, Verify: true})
	if err != nil {
		fmt.Fprintln(stderr, "memgen plugin-check:", err)
		return exitSpec
	}
	info := probe.Info()
	if err := probe.Close(); err != nil {
		fmt.Fprintln(stderr, "memgen plugin-check:", err)
		return exitSpec
	}
	d := l.Declaration()
	fmt.Fprintf(stdout, "plugin %s: ABI %d.%d, %v device %d, offers %v, alloc granularity %d, granularity %d, config %q\n",
		l.Name, l.Version>>16, l.Version&0xffff, l.Device.Kind, info.Device.Ordinal, l.Offers(), info.AllocGranularity, info.Granularity, o.config)
	failed := false
	for _, wrapped := range []bool{false, true} {
		name := "bare"
		if wrapped {
			name = "checked"
		}
		res := conformancetest.Record(func(t conformance.T) conformance.Subject {
			m, err := l.New(plugin.Options{Config: o.config, Verify: true})
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
			if wrapped {
				mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
			}
			return conformance.Subject{Mechanism: mech, Context: c, Declared: &d, HostMapped: l.Device.Kind == memapi.DeviceKindHost}
		})
		leaves := res.Leaves()
		f, skipped := res.Failed(), res.Skipped()
		fmt.Fprintf(stdout, "%s: %d subtests, %d passed, %d failed, %d skipped\n", name, len(leaves), len(leaves)-len(f)-len(skipped), len(f), len(skipped))
		if len(f) > 0 {
			failed = true
			io.WriteString(stdout, res.Report())
		}
		if o.verbose {
			for _, n := range skipped {
				fmt.Fprintf(stdout, "--- SKIP: %s\n", n)
			}
		}
	}
	if failed {
		fmt.Fprintln(stdout, "memgen plugin-check: FAIL")
		return exitSpec
	}
	fmt.Fprintln(stdout, "memgen plugin-check: ok")
	return exitOK
}
