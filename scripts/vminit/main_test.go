package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestCpioEntries reads back what cpioWriter wrote, field by field as the
// kernel does: each header and each file's data start 4-byte aligned, and
// names, modes and contents survive.
func TestCpioEntries(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"a.ko": "x", "bb.ko": "12345", "ccc.ko": ""}
	var raw bytes.Buffer
	w := cpioWriter{w: &raw}
	w.dir("modules")
	for _, name := range []string{"a.ko", "bb.ko", "ccc.ko"} {
		src := filepath.Join(dir, name)
		if err := os.WriteFile(src, []byte(files[name]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := w.file("modules/"+name, src); err != nil {
			t.Fatal(err)
		}
	}
	w.trailer()

	type entry struct {
		name string
		mode uint64
		data string
	}
	var got []entry
	b := raw.Bytes()
	for off := 0; off < len(b); {
		if off%4 != 0 {
			t.Fatalf("header at offset %d is not 4-byte aligned", off)
		}
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic %q at offset %d", h[:6], off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(h[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("field %d at offset %d: %v", i, off, err)
			}
			return int(v)
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+nameLen-1])
		dataOff := (off + 110 + nameLen + 3) &^ 3
		got = append(got, entry{name, uint64(mode), string(b[dataOff : dataOff+size])})
		off = (dataOff + size + 3) &^ 3
	}
	want := []entry{
		{"modules", 0o40755, ""},
		{"modules/a.ko", 0o100755, "x"},
		{"modules/bb.ko", 0o100755, "12345"},
		{"modules/ccc.ko", 0o100755, ""},
		{"TRAILER!!!", 0, ""},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}
