package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]uint64{
		"0": 0, "4096": 4096, "4096B": 4096, "4096b": 4096, " 64K ": 64 << 10, "64KiB": 64 << 10, "64kb": 64 << 10,
		"512MiB": 512 << 20, "512M": 512 << 20, "1GiB": 1 << 30, "1G": 1 << 30, "1gb": 1 << 30, "1.5GiB": 3 << 29,
		"2TiB": 2 << 40, "2t": 2 << 40, "0.5KiB": 512, "4 MiB": 4 << 20, "4194304TiB": 1 << 62,
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1XiB", "1.5", "0.3B", "4194305TiB", "99999999999999999999", "1e3", "abc", "1.2.3K"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatRoundTrips(t *testing.T) {
	for n, want := range map[uint64]string{0: "0", 1536: "1536B", 160 << 20: "160MiB", 64 << 10: "64KiB", 3 << 40: "3TiB", 1<<30 + 1: "1073741825B"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
		if back, err := Parse(Format(n)); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
