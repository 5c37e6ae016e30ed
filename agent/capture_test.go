package agent_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/safe-run/safe-run/agent"
)

// randBytes returns n pseudo-random bytes, the same for the same seed.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5afe))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// wantKept returns what a Capture of limit bytes must keep of in: the first
// limit-limit/2 bytes as head, and of what follows, the last limit/2 bytes
// as tail.
func wantKept(limit int64, in []byte) (head, tail []byte) {
	hm, tm := int(limit-limit/2), int(limit/2)
	head = in[:min(len(in), hm)]
	rest := in[len(head):]
	tail = rest[max(0, len(rest)-tm):]
	return head, tail
}

// checkCapture fails the test unless c holds exactly what a Capture of
// c.Max must keep after in was written to it.
func checkCapture(t *testing.T, c *agent.Capture, in []byte) {
	t.Helper()
	head, tail := wantKept(c.Max, in)
	if !bytes.Equal(c.Head(), head) {
		t.Errorf("Head() = %d bytes %.16x…, want %d bytes %.16x…", len(c.Head()), c.Head(), len(head), head)
	}
	if !bytes.Equal(c.Tail(), tail) {
		t.Errorf("Tail() = %d bytes %.16x…, want %d bytes %.16x…", len(c.Tail()), c.Tail(), len(tail), tail)
	}
	if got, want := c.Total(), int64(len(in)); got != want {
		t.Errorf("Total() = %d, want %d", got, want)
	}
	if got, want := c.Omitted(), int64(len(in)-len(head)-len(tail)); got != want {
		t.Errorf("Omitted() = %d, want %d", got, want)
	}
}

// write writes each chunk to c, checking Write's results.
func write(t *testing.T, c *agent.Capture, chunks ...[]byte) {
	t.Helper()
	for _, p := range chunks {
		n, err := c.Write(p)
		if n != len(p) || err != nil {
			t.Fatalf("Write(%d bytes) = %d, %v; want %d, nil", len(p), n, err, len(p))
		}
	}
}

func TestCaptureUnderCap(t *testing.T) {
	tests := []struct {
		name   string
		max    int64
		chunks []string
	}{
		{"nothing written", 10, nil},
		{"empty write", 10, []string{""}},
		{"one write within the head", 10, []string{"hello"}},
		{"one write into the tail", 10, []string{"hello wor"}},
		{"one write filling the cap", 10, []string{"0123456789"}},
		{"small writes filling the cap", 10, []string{"01", "234", "", "5", "6789"}},
		{"byte by byte", 7, []string{"a", "b", "c", "d", "e", "f", "g"}},
		{"odd max", 5, []string{"abc", "de"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &agent.Capture{Max: tt.max}
			var in []byte
			for _, s := range tt.chunks {
				write(t, c, []byte(s))
				in = append(in, s...)
			}
			checkCapture(t, c, in)
			if got := append(bytes.Clone(c.Head()), c.Tail()...); !bytes.Equal(got, in) {
				t.Errorf("Head()+Tail() = %q, want everything written, %q", got, in)
			}
			if c.Omitted() != 0 {
				t.Errorf("Omitted() = %d, want 0", c.Omitted())
			}
		})
	}
}

func TestCaptureOverCap(t *testing.T) {
	tests := []struct {
		name     string
		max      int64
		n        int
		headLen  int
		tailLen  int
		omitted  int64
		oneWrite bool
	}{
		{"one byte over", 10, 11, 5, 5, 1, true},
		{"far over", 10, 1000, 5, 5, 990, true},
		{"odd max", 11, 100, 6, 5, 89, true},
		{"large odd max", 1001, 5000, 501, 500, 3999, true},
		{"one byte over, byte by byte", 10, 11, 5, 5, 1, false},
		{"far over, byte by byte", 9, 1000, 5, 4, 991, false},
		{"max 2", 2, 50, 1, 1, 48, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := randBytes(uint64(tt.n), tt.n)
			c := &agent.Capture{Max: tt.max}
			if tt.oneWrite {
				write(t, c, in)
			} else {
				for i := range in {
					write(t, c, in[i:i+1])
				}
			}
			if len(c.Head()) != tt.headLen || !bytes.Equal(c.Head(), in[:tt.headLen]) {
				t.Errorf("Head() = %d bytes, want the first %d bytes written", len(c.Head()), tt.headLen)
			}
			if len(c.Tail()) != tt.tailLen || !bytes.Equal(c.Tail(), in[tt.n-tt.tailLen:]) {
				t.Errorf("Tail() = %d bytes, want the last %d bytes written", len(c.Tail()), tt.tailLen)
			}
			if c.Omitted() != tt.omitted {
				t.Errorf("Omitted() = %d, want %d", c.Omitted(), tt.omitted)
			}
			if c.Total() != int64(tt.n) {
				t.Errorf("Total() = %d, want %d", c.Total(), tt.n)
			}
		})
	}
}

func TestCaptureTinyMax(t *testing.T) {
	tests := []struct {
		max        int64
		head, tail string
	}{
		{0, "", ""},
		{1, "h", ""},
		{2, "h", "d"},
		{3, "he", "d"},
		{4, "he", "ld"},
		{5, "hel", "ld"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("max %d", tt.max), func(t *testing.T) {
			for _, split := range []bool{false, true} {
				c := &agent.Capture{Max: tt.max}
				in := []byte("hello world")
				if split {
					write(t, c, in[:3], in[3:4], nil, in[4:])
				} else {
					write(t, c, in)
				}
				if string(c.Head()) != tt.head || string(c.Tail()) != tt.tail {
					t.Errorf("split %v: Head, Tail = %q, %q; want %q, %q", split, c.Head(), c.Tail(), tt.head, tt.tail)
				}
				if want := int64(len(in) - len(tt.head) - len(tt.tail)); c.Omitted() != want {
					t.Errorf("split %v: Omitted() = %d, want %d", split, c.Omitted(), want)
				}
				if c.Total() != int64(len(in)) {
					t.Errorf("split %v: Total() = %d, want %d", split, c.Total(), len(in))
				}
			}
		})
	}
}

func TestCaptureZeroValue(t *testing.T) {
	var c agent.Capture
	write(t, &c, []byte("some output"), []byte("more"))
	if len(c.Head()) != 0 || len(c.Tail()) != 0 {
		t.Errorf("zero Capture kept Head %q, Tail %q; want nothing", c.Head(), c.Tail())
	}
	if c.Total() != 15 || c.Omitted() != 15 {
		t.Errorf("Total, Omitted = %d, %d; want 15, 15", c.Total(), c.Omitted())
	}
}

// TestCaptureSplitWrites checks that how a stream is cut into writes does not
// change what a Capture keeps: pseudo-random splits must give the same head
// and tail as one write of the whole stream.
func TestCaptureSplitWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, capMax := range []int64{0, 1, 2, 3, 7, 8, 64, 1000, 1001, 32 << 10} {
		for _, n := range []int{0, 1, int(capMax) - 1, int(capMax), int(capMax) + 1, 3*int(capMax) + 5, 100*int(capMax) + 17, 10_000} {
			if n < 0 {
				continue
			}
			t.Run(fmt.Sprintf("max %d, %d bytes", capMax, n), func(t *testing.T) {
				in := randBytes(uint64(capMax)<<32|uint64(n), n)
				whole := &agent.Capture{Max: capMax}
				write(t, whole, in)
				checkCapture(t, whole, in)

				for trial := range 20 {
					split := &agent.Capture{Max: capMax}
					// Chunks range from empty to larger than the cap, so
					// that writes land in the head, straddle the head and
					// the tail, and overflow the tail buffer.
					limit := 2*int(capMax) + 3
					if trial%2 == 1 {
						limit = int(capMax)/2 + 2 // mostly writes smaller than the tail
					}
					var chunks int
					for rest := in; len(rest) > 0; chunks++ {
						k := min(rng.IntN(limit+1), len(rest))
						write(t, split, rest[:k])
						rest = rest[k:]
					}
					if !bytes.Equal(split.Head(), whole.Head()) || !bytes.Equal(split.Tail(), whole.Tail()) ||
						split.Total() != whole.Total() || split.Omitted() != whole.Omitted() {
						t.Errorf("trial %d: %d writes kept head %d bytes, tail %d bytes, omitted %d; one write kept %d, %d, %d",
							trial, chunks, len(split.Head()), len(split.Tail()), split.Omitted(),
							len(whole.Head()), len(whole.Tail()), whole.Omitted())
						checkCapture(t, split, in)
						return
					}
				}
			})
		}
	}
}

// TestCaptureTailAfterEachWrite checks the tail after every write, not only
// at the end, since the agent may read it at any time the stream ends.
func TestCaptureTailAfterEachWrite(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const capMax = 100
	in := randBytes(7, 5000)
	c := &agent.Capture{Max: capMax}
	for written := 0; written < len(in); {
		k := min(1+rng.IntN(70), len(in)-written)
		write(t, c, in[written:written+k])
		written += k
		head, tail := wantKept(capMax, in[:written])
		if !bytes.Equal(c.Head(), head) || !bytes.Equal(c.Tail(), tail) {
			t.Fatalf("after %d bytes: head %d bytes, tail %d bytes differ from the first %d and last %d written",
				written, len(c.Head()), len(c.Tail()), len(head), len(tail))
		}
	}
}

func ExampleCapture() {
	c := agent.Capture{Max: 10}
	for i := 1; i <= 5; i++ {
		fmt.Fprintf(&c, "line%d\n", i)
	}
	fmt.Printf("head %q\n", c.Head())
	fmt.Printf("tail %q\n", c.Tail())
	fmt.Println("total", c.Total(), "omitted", c.Omitted())
	// Output:
	// head "line1"
	// tail "ine5\n"
	// total 30 omitted 20
}
