package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

const imageUsage = `Usage: safe-run image COMMAND [flags]

Commands:
  import --name NAME [--key KEY] FILE   extract a root file system archive (tar or tar.gz) into the cache
  ls [--json]                           list the images in the cache
  dir                                   print the cache directory
  check --name NAME [--key KEY]         exit 0 if NAME is imported (and has KEY)

The default image is built by scripts/build-rootfs.sh (make rootfs).
`

func cmdImage(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(os.Stderr, imageUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	fs := flag.NewFlagSet("image "+args[0], flag.ContinueOnError)
	cacheDir := fs.String("cache-dir", "", "image cache directory (env SAFE_RUN_CACHE; default "+rootfs.DefaultDir()+")")
	name := fs.String("name", rootfs.DefaultName, "image name")
	key := fs.String("key", "", "content key (import: default the archive's SHA-256)")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, done := parseFlags(fs, args[1:]); done {
		return code
	}
	store := rootfs.Store{Dir: *cacheDir}
	switch args[0] {
	case "import":
		if fs.NArg() != 1 {
			return fail(usageError("image import takes one archive FILE"))
		}
		return imageImport(store, *name, *key, fs.Arg(0), *asJSON)
	case "ls":
		imgs, err := store.List()
		if err != nil {
			return fail(err)
		}
		if *asJSON {
			return printJSON(map[string]any{"cache_dir": store.Path(), "images": imgs})
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAMES\tKEY\tSIZE\tCREATED")
		for _, img := range imgs {
			fmt.Fprintf(tw, "%v\t%s\t%s\t%s\n", img.Names, img.Key, sandbox.FormatBytes(img.Stats.Bytes), img.Created.Format(time.DateTime))
		}
		tw.Flush()
		return 0
	case "dir":
		fmt.Println(store.Path())
		return 0
	case "check":
		img, err := store.Lookup(*name)
		if err != nil {
			return fail(err)
		}
		if *key != "" && img.Key != *key {
			return fail(fmt.Errorf("image %q is %s, not %s", *name, img.Key, *key))
		}
		fmt.Println(img.Root)
		return 0
	}
	return fail(usageError("unknown image command %q; see `safe-run image -h`", args[0]))
}

func imageImport(store rootfs.Store, name, key, archive string, asJSON bool) int {
	progress := newProgress("extracting " + archive)
	img, err := store.Import(name, archive, rootfs.ImportOptions{
		Key:         key,
		Mountpoints: imageMountpoints(),
		Progress:    progress.update,
	})
	progress.done()
	if err != nil {
		return fail(err)
	}
	if asJSON {
		return printJSON(img)
	}
	fmt.Fprintf(os.Stderr, "image %q is %s: %s in %d entries (%d device nodes skipped, %d setuid/setgid bits stripped)\n",
		name, img.Key, sandbox.FormatBytes(img.Stats.Bytes), img.Stats.Entries, img.Stats.Skipped, img.Stats.Stripped)
	return 0
}

func printJSON(v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(err)
	}
	return 0
}

// progress shows how far a long operation got on stderr: a line rewritten in
// place on a terminal, a line per tenth otherwise (CI logs).
type progress struct {
	label    string
	tty      bool
	last     time.Time
	lastTick int64
	shown    bool
}

func newProgress(label string) *progress {
	return &progress{label: label, tty: term.IsTerminal(int(os.Stderr.Fd()))}
}

func (p *progress) update(done, total int64) {
	if total <= 0 {
		return
	}
	pct := done * 100 / total
	switch {
	case p.tty:
		if time.Since(p.last) < 100*time.Millisecond && done < total {
			return
		}
		p.last = time.Now()
		fmt.Fprintf(os.Stderr, "\r%s: %3d%% (%s of %s)", p.label, pct, sandbox.FormatBytes(done), sandbox.FormatBytes(total))
	case pct/10 > p.lastTick || !p.shown:
		p.lastTick = pct / 10
		fmt.Fprintf(os.Stderr, "%s: %d%% (%s of %s)\n", p.label, pct, sandbox.FormatBytes(done), sandbox.FormatBytes(total))
	}
	p.shown = true
}

func (p *progress) done() {
	if p.tty && p.shown {
		fmt.Fprintln(os.Stderr)
	}
}
