package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/safe-run/safe-run/rootfs"
)

// coldMain measures only the cold CLI against raw `runsc run` of the
// equivalent bundle, print(1), rows taking turns run by run: for each
// safe-run binary (-safe-run, then each -compare), the time until the
// process exits (what a shell that waits for it sees) and the time until
// its output ends (what a reader of its stdout sees), each divided by
// raw runsc's p50 of the same run. With -compare OLD/safe-run, a change's
// before and after share one machine, one load and one raw runsc.
func coldMain(o options, compare []string) {
	img, err := rootfs.Store{}.Lookup(rootfs.DefaultName)
	must(err)
	raw, err := newRawRunsc(o, img.Root)
	must(err)
	defer raw.close()
	bins := append([]string{o.bin}, compare...)
	const code = "print(1)"
	// Warm-up outside the timing: caches, the image's pages.
	must(raw.run(code))
	for _, b := range bins {
		if _, _, err := timedColdRun(b, code); err != nil {
			fatal(err)
		}
	}
	rawDs := []time.Duration{}
	exitDs := make([][]time.Duration, len(bins))
	eofDs := make([][]time.Duration, len(bins))
	for range o.runs {
		start := time.Now()
		must(raw.run(code))
		rawDs = append(rawDs, time.Since(start))
		for i, b := range bins {
			exit, eof, err := timedColdRun(b, code)
			must(err)
			exitDs[i] = append(exitDs[i], exit)
			eofDs[i] = append(eofDs[i], eof)
		}
	}
	r := summarise(rawDs)
	fmt.Printf("| cold print(1), %d runs each, turns | p50 ms (min) | ÷ raw p50 |\n|---|---|---|\n", o.runs)
	fmt.Printf("| `runsc run` — gVisor alone | %.1f (%.1f) | 1.00 × |\n", r.P50, r.Min)
	for i, b := range bins {
		for _, m := range []struct {
			what string
			ds   []time.Duration
		}{{"until it exits", exitDs[i]}, {"until its stdout ends", eofDs[i]}} {
			s := summarise(m.ds)
			fmt.Printf("| `%s run` %s | %.1f (%.1f) | %.2f × |\n", b, m.what, s.P50, s.Min, s.P50/r.P50)
		}
	}
}

// timedColdRun runs `bin run --lang python -c code` and returns the time
// until the process exited and until its stdout reached EOF.
func timedColdRun(bin, code string) (exit, eof time.Duration, err error) {
	cmd := exec.Command(bin, "run", "--lang", "python", "-c", code)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	data, rerr := io.ReadAll(out)
	eof = time.Since(start)
	werr := cmd.Wait()
	exit = time.Since(start)
	if rerr != nil || werr != nil || string(data) != "1\n" {
		return 0, 0, fmt.Errorf("%s run: %v %v, output %q", bin, rerr, werr, data)
	}
	return exit, eof, nil
}

// listFlag collects a repeatable flag's values.
type listFlag []string

func (l *listFlag) String() string     { return fmt.Sprint(*l) }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }
