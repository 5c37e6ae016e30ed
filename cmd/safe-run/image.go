package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/safe-run/safe-run/rootfs"
	"github.com/safe-run/safe-run/sandbox"
)

var imageUsage = fmt.Sprintf(`Usage: safe-run image COMMAND [flags]

Commands:
  pull [--name NAME] [--replace] REF  download an image from a registry (credentials from ~/.docker/config.json)
  import [--name NAME] [--key KEY] [--replace] FILE
                                      import a docker save archive, an OCI layout (archive or directory),
                                      or a root file system tar (.tar or .tar.gz)
  build default                       build the default image with its recipe (debootstrap as root, mmdebstrap otherwise)
  ls [--json]                         list the images in the cache
  rm NAME...                          remove names, and images no name points to any more
  dir                                 print the cache directory
  check [--name NAME] [--key KEY]     exit 0 if NAME is in the cache, complete (and has KEY)
  push [--agent PATH] NAME REF        push the cached image NAME, with the agent at /.safe-run/agent,
                                      to the registry as the tag REF (credentials as for pull)

An image is named by REF when pulled, by its archive's tag when imported (or
"default" for a root file system tar), unless --name says otherwise. A name
that already points to another image is left alone unless --replace is given
(a pull re-points REF itself); a name pinned to a digest (REF@sha256:...) can
only name an image of that digest. Every layer is checked against the digest
its image's configuration lists. Images are flattened into read-only root
directories; runs pick one with --image.

Flags (all commands): --cache-dir DIR, --json, --max-size SIZE (all files of an
image, default %s), --max-file-size SIZE (one file, default %s).
`, sandbox.FormatBytes(rootfs.DefaultExtractLimits.MaxBytes), sandbox.FormatBytes(rootfs.DefaultExtractLimits.MaxFileBytes))

// imageFlags are the flags of every image command.
type imageFlags struct {
	cacheDir, name, key, agent string
	asJSON, replace            bool
	limits                     rootfs.ExtractLimits
}

// imageVerbs are the image commands, one function each.
var imageVerbs = map[string]func(ctx context.Context, f imageFlags, operands []string) int{
	"pull": imagePull, "import": imageImport, "build": imageBuild, "ls": imageList,
	"rm": imageRemove, "dir": imageDir, "check": imageCheck, "push": imagePush,
}

func cmdImage(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(os.Stderr, imageUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	fs := flag.NewFlagSet("image "+args[0], flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), imageUsage) }
	f := imageFlags{limits: rootfs.DefaultExtractLimits}
	fs.StringVar(&f.cacheDir, "cache-dir", "", "image cache directory (env "+envName("cache-dir")+"; default "+rootfs.DefaultDir()+")")
	fs.StringVar(&f.name, "name", "", "image name")
	fs.StringVar(&f.key, "key", "", "content key of a root file system archive (import: default the archive's SHA-256)")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	fs.StringVar(&f.agent, "agent", "", "push: the safe-run-agent binary to put in the image (default: the one next to safe-run)")
	fs.BoolVar(&f.replace, "replace", false, "pull, import: point an existing name at the new image")
	fs.Var(sizeFlag{&f.limits.MaxBytes}, "max-size", "most bytes of files in one image")
	fs.Var(sizeFlag{&f.limits.MaxFileBytes}, "max-file-size", "largest file in an image")
	// Flags may come after the operands too: image pull REF --json.
	var operands []string
	for rest := args[1:]; ; {
		if code, done := parseFlags(fs, rest); done {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		operands = append(operands, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	verb, ok := imageVerbs[args[0]]
	if !ok {
		return fail(usageError("unknown image command %q; see `safe-run image -h`", args[0]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return verb(ctx, f, operands)
}

func (f imageFlags) store() rootfs.Store { return rootfs.Store{Dir: f.cacheDir} }

// importOptions are the options of the commands that write an image,
// reporting progress as label.
func (f imageFlags) importOptions(label string) (rootfs.ImportOptions, *progress) {
	p := newProgress(label)
	return rootfs.ImportOptions{Key: f.key, Mountpoints: imageMountpoints(), Limits: f.limits, Replace: f.replace,
		Progress: p.update}, p
}

func imagePull(ctx context.Context, f imageFlags, operands []string) int {
	if len(operands) != 1 {
		return fail(usageError("image pull takes one image reference, e.g. python:3.12-slim"))
	}
	ref := operands[0]
	if f.name == "" {
		f.name = ref
	}
	opts, progress := f.importOptions("pulling " + ref)
	start := time.Now()
	img, err := f.store().Pull(ctx, f.name, ref, opts)
	progress.done()
	if err != nil {
		return fail(err)
	}
	return imageDone(img, f.name, time.Since(start), f.asJSON)
}

func imageImport(ctx context.Context, f imageFlags, operands []string) int {
	if len(operands) != 1 {
		return fail(usageError("image import takes one archive FILE"))
	}
	opts, progress := f.importOptions("extracting " + operands[0])
	start := time.Now()
	img, err := f.store().ImportFile(ctx, f.name, operands[0], opts)
	progress.done()
	if err != nil {
		return fail(err)
	}
	return imageDone(img, img.Names[0], time.Since(start), f.asJSON)
}

func imageBuild(ctx context.Context, f imageFlags, operands []string) int {
	if len(operands) != 1 || operands[0] != rootfs.DefaultName {
		return fail(usageError("image build takes the name of a recipe; the only one is: default"))
	}
	opts, progress := f.importOptions("extracting the default image")
	start := time.Now()
	img, built, err := f.store().BuildDefault(ctx, opts, os.Stderr)
	progress.done()
	if err != nil {
		return fail(err)
	}
	if !built && !f.asJSON {
		fmt.Fprintf(os.Stderr, "the default image %s is up to date\n", img.Key)
		return 0
	}
	return imageDone(img, rootfs.DefaultName, time.Since(start), f.asJSON)
}

func imageList(_ context.Context, f imageFlags, _ []string) int {
	store := f.store()
	imgs, err := store.List()
	if err != nil {
		return fail(err)
	}
	if f.asJSON {
		return printJSON(map[string]any{"cache_dir": store.Path(), "images": imgs})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMES\tKEY\tID\tSIZE\tCREATED\tSOURCE")
	for _, img := range imgs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", strings.Join(img.Names, ","), img.Key, shownID(img), sandbox.FormatBytes(img.Stats.Bytes),
			img.Created.Format(time.DateTime), shownSource(img))
	}
	tw.Flush()
	return 0
}

func imageRemove(_ context.Context, f imageFlags, operands []string) int {
	if len(operands) == 0 {
		return fail(usageError("image rm takes the names to remove"))
	}
	store := f.store()
	code := 0
	for _, n := range operands {
		removed, err := store.Remove(n)
		switch {
		case err != nil:
			code = fail(err)
		case removed.Root != "":
			fmt.Fprintf(os.Stderr, "removed %s and its image %s\n", n, removed.Key)
		default:
			fmt.Fprintf(os.Stderr, "removed %s; image %s keeps its other names\n", n, removed.Key)
		}
	}
	return code
}

func imageDir(_ context.Context, f imageFlags, _ []string) int {
	fmt.Println(f.store().Path())
	return 0
}

func imageCheck(_ context.Context, f imageFlags, _ []string) int {
	if f.name == "" {
		f.name = rootfs.DefaultName
	}
	img, err := f.store().Lookup(f.name)
	if err != nil {
		return fail(err)
	}
	if f.key != "" && img.Key != f.key {
		return fail(fmt.Errorf("image %q is %s, not %s", f.name, img.Key, f.key))
	}
	fmt.Println(img.Root)
	return 0
}

// imageDone reports an image just pulled, imported or built, and what
// became of its name.
func imageDone(img rootfs.Image, name string, took time.Duration, asJSON bool) int {
	if asJSON {
		return printJSON(img)
	}
	var change string
	switch img.NameChange {
	case "created":
		change = "new name"
	case "unchanged":
		change = "the name already pointed to it"
	case "replaced":
		change = "name replaced: it pointed to " + img.PreviousKey + " before"
	}
	if img.Reused {
		fmt.Fprintf(os.Stderr, "image %q is %s, already in the cache (%s)\n", name, img.Key, change)
		return 0
	}
	fmt.Fprintf(os.Stderr, "image %q is %s (%s): %s in %d entries, in %.1fs (%d device nodes skipped, %d setuid/setgid bits stripped, %d paths removed by whiteouts)\n",
		name, img.Key, change, sandbox.FormatBytes(img.Stats.Bytes), img.Stats.Entries, took.Seconds(), img.Stats.Skipped, img.Stats.Stripped, img.Stats.Whiteouts)
	return 0
}

// shownID is the image ID `image ls` shows: "-" for a root file system,
// and a warning for an ID whose layers were never checked against it.
func shownID(img rootfs.Image) string {
	id := img.ImageID
	if len(id) > 19 {
		id = id[:19] // sha256: and 12 hex digits, as docker shows
	}
	switch {
	case id == "":
		return "-"
	case !img.LayersVerified:
		return "unverified " + id + " (re-import)"
	}
	return id
}

// shownSource is where `image ls` says an image came from.
func shownSource(img rootfs.Image) string {
	if img.Origin != "" {
		return img.Origin + " " + img.Source
	}
	return img.Source
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
// place on a terminal, a line per tenth otherwise (CI logs). Without a
// total, it shows the bytes done, every 64 MiB off a terminal.
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
	var line string
	var tick int64
	if total > 0 {
		pct := done * 100 / total
		line = fmt.Sprintf("%s: %3d%% (%s of %s)", p.label, pct, sandbox.FormatBytes(done), sandbox.FormatBytes(total))
		tick = pct / 10
	} else {
		line = fmt.Sprintf("%s: %s", p.label, sandbox.FormatBytes(done))
		tick = done / (64 << 20)
	}
	switch {
	case p.tty:
		if time.Since(p.last) < 100*time.Millisecond && (total <= 0 || done < total) {
			return
		}
		p.last = time.Now()
		fmt.Fprintf(os.Stderr, "\r%s", line)
	case tick > p.lastTick || !p.shown:
		p.lastTick = tick
		fmt.Fprintln(os.Stderr, strings.TrimSpace(line))
	}
	p.shown = true
}

func (p *progress) done() {
	if p.tty && p.shown {
		fmt.Fprintln(os.Stderr)
	}
}
