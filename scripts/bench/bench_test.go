package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestBurstClassify(t *testing.T) {
	off := Burst{Stats: Stats{Min: 300}} // warm: under 150 ms
	for _, tc := range []struct {
		name          string
		calls         []float64
		warm, inARow  int
		missesP50     float64
		missesPresent bool
	}{
		{"alternating", []float64{20, 25, 350, 30, 320}, 3, 2, 320, true}, // p50 is the lower median
		{"all warm", []float64{20, 25}, 2, 2, 0, false},
		{"first missed", []float64{400, 20}, 1, 0, 400, true},
		{"at the threshold is a miss", []float64{150}, 0, 0, 150, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Burst{Name: tc.name, Calls: tc.calls}
			b.classify(off)
			if b.Warm != tc.warm || b.FirstWarm != tc.inARow {
				t.Errorf("warm %d, first %d in a row; want %d, %d", b.Warm, b.FirstWarm, tc.warm, tc.inARow)
			}
			if (b.Misses != nil) != tc.missesPresent {
				t.Fatalf("misses %v, want present %v", b.Misses, tc.missesPresent)
			}
			if b.Misses != nil && b.Misses.P50 != tc.missesP50 {
				t.Errorf("misses' p50 %v, want %v", b.Misses.P50, tc.missesP50)
			}
		})
	}
}

func TestMemoryStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       map[string]int64
	}{
		{"v1", "cache 1\nrss 2\nshmem 3\ntotal_cache 10\ntotal_rss 20\ntotal_shmem 30\nanon 99\n", map[string]int64{"file": 10, "anon": 20, "shmem": 30}},
		{"v2", "anon 5\nfile 6\nkernel 7\nshmem 8\n", map[string]int64{"anon": 5, "file": 6, "shmem": 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "memory.stat")
			if err := os.WriteFile(path, []byte(tc.stat), 0o644); err != nil {
				t.Fatal(err)
			}
			got := memoryStat(path)
			if len(got) != len(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %d, want %d", k, got[k], v)
				}
			}
		})
	}
}
