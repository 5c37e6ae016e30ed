package sandbox_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/safe-run/safe-run/sandbox"
)

const (
	kib = sandbox.KiB
	mib = sandbox.MiB
	gib = sandbox.GiB
	tib = int64(1) << 40
)

func TestParseBytes(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want int64
	}{
		{"plain number", "1048576", 1048576},
		{"zero", "0", 0},
		{"byte suffix", "1b", 1},
		{"byte suffix upper case", "17B", 17},
		{"binary MiB", "512MiB", 512 * mib},
		{"single letter is binary", "1g", gib},
		{"single letter upper case", "256M", 256 * mib},
		{"single letter k", "10k", 10 * kib},
		{"KiB", "10KiB", 10 * kib},
		{"fraction of GiB", "1.5GiB", 3 * gib / 2},
		{"fraction without leading digit", ".5k", 512},
		{"trailing dot", "5.", 5},
		{"decimal KB", "10KB", 10_000},
		{"decimal kb lower case", "10kb", 10_000},
		{"decimal MB", "2MB", 2_000_000},
		{"decimal GB", "3GB", 3_000_000_000},
		{"decimal fraction", "0.5KB", 500},
		{"TiB", "2TiB", 2 * tib},
		{"single letter t", "1t", tib},
		{"decimal TB", "1TB", 1_000_000_000_000},
		{"mixed case unit", "512mIb", 512 * mib},
		{"surrounding whitespace", "  256m \n", 256 * mib},
		{"tabs around", "\t1G\t", gib},
		{"space between number and unit", "512 MiB", 512 * mib},
		{"fractional bytes are truncated", "1.9", 1},
		{"largest TiB count below 2^63", "8388607TiB", 8388607 * tib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sandbox.ParseBytes(tt.in)
			if err != nil {
				t.Fatalf("ParseBytes(%q) error: %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("ParseBytes(%q) = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseBytesErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // substring of the error message
	}{
		{"empty", "", "invalid size"},
		{"only whitespace", "   ", "invalid size"},
		{"letters", "abc", "invalid size"},
		{"unit only", "MiB", "invalid size"},
		{"unknown unit", "12XB", "invalid size"},
		{"unit with trailing letter", "5KiBs", "invalid size"},
		{"negative", "-5", "invalid size"},
		{"negative with unit", "-5MiB", "invalid size"},
		{"explicit plus", "+5", "invalid size"},
		{"two dots", "1.2.3", "invalid size"},
		{"lone dot", ".", "invalid size"},
		{"dot with unit", ".MiB", "invalid size"},
		{"two numbers", "1 2", "invalid size"},
		{"exponent", "1e3", "invalid size"},
		{"hexadecimal", "0x10", "invalid size"},
		{"digit separator", "1_000", "invalid size"},
		{"decimal comma", "1,5GiB", "invalid size"},
		{"NaN", "NaN", "invalid size"},
		{"Inf", "Inf", "invalid size"},
		{"trailing words", "5 MiB please", "invalid size"},
		{"2^63 bytes", "9223372036854775808", "too large"},
		{"2^63 bytes as TiB", "8388608TiB", "too large"},
		{"far over int64", "100000000000000000000", "too large"},
		{"huge with unit", "100000000000GiB", "too large"},
		{"beyond float64", "1" + strings.Repeat("0", 400), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sandbox.ParseBytes(tt.in)
			if err == nil {
				t.Fatalf("ParseBytes(%q) = %d, want an error", tt.in, got)
			}
			if got != 0 {
				t.Errorf("ParseBytes(%q) returned %d with its error, want 0", tt.in, got)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseBytes(%q) error = %q, want it to contain %q", tt.in, err, tt.want)
			}
			if len(tt.in) < 100 && !strings.Contains(err.Error(), strconv.Quote(tt.in)) {
				t.Errorf("ParseBytes(%q) error = %q, want it to quote the input", tt.in, err)
			}
		})
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1000B"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{1536, "1.5KiB"},
		{1_000_000, "976.56KiB"},
		{mib, "1MiB"},
		{64 * mib, "64MiB"},
		{512 * mib, "512MiB"},
		{536870912, "512MiB"},
		{1610612736, "1.5GiB"},
		{gib + gib/4, "1.25GiB"},
		{gib + 1, "1GiB"},
		{16 * gib, "16GiB"},
		{tib, "1024GiB"},
		{-1, "-1B"},
	}
	for _, tt := range tests {
		t.Run(strconv.FormatInt(tt.in, 10), func(t *testing.T) {
			if got := sandbox.FormatBytes(tt.in); got != tt.want {
				t.Errorf("FormatBytes(%d) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestFormatBytesRoundTrip checks that ParseBytes reads back what
// FormatBytes writes, for sizes FormatBytes renders exactly.
func TestFormatBytesRoundTrip(t *testing.T) {
	for _, n := range []int64{
		0, 1, 512, 1023,
		kib, 3 * kib / 2, 100 * kib,
		mib, 7 * mib / 4, 64 * mib, 256 * mib, 512 * mib,
		gib, 5 * gib / 4, 3 * gib / 2, 16 * gib, 64 * gib,
		tib,
	} {
		s := sandbox.FormatBytes(n)
		t.Run(s, func(t *testing.T) {
			got, err := sandbox.ParseBytes(s)
			if err != nil {
				t.Fatalf("ParseBytes(FormatBytes(%d) = %q) error: %v", n, s, err)
			}
			if got != n {
				t.Errorf("ParseBytes(FormatBytes(%d) = %q) = %d", n, s, got)
			}
		})
	}
}

func ExampleParseBytes() {
	for _, s := range []string{"512MiB", "1g", "1.5GiB", "10KB", "1048576"} {
		n, err := sandbox.ParseBytes(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Printf("%-8s = %10d bytes = %s\n", s, n, sandbox.FormatBytes(n))
	}
	if _, err := sandbox.ParseBytes("12XB"); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 512MiB   =  536870912 bytes = 512MiB
	// 1g       = 1073741824 bytes = 1GiB
	// 1.5GiB   = 1610612736 bytes = 1.5GiB
	// 10KB     =      10000 bytes = 9.77KiB
	// 1048576  =    1048576 bytes = 1MiB
	// invalid size "12XB"; write a number with an optional unit, e.g. 512MiB or 2GiB
}
