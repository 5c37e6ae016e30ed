package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/safe-run/safe-run/sandbox"
	"github.com/safe-run/safe-run/snippets"
)

const checkUsage = `Usage: safe-run check [flags] PATH...

Runs every fenced code block of the Markdown documents PATH names (files,
and directories searched recursively for .md and .markdown files, skipping
.git, node_modules, vendor and third_party) in sandboxes, as tests, and
compares what each prints with the output block that follows it. Blocks run
with the limits of ` + "`safe-run run`" + ` (the flags below set defaults,
a block's attributes override them within the policy), and with TZ=UTC,
LC_ALL=C.UTF-8 and PYTHONHASHSEED=0 unless --env says otherwise.

Exit codes: 0 every block passed, 1 a block failed, 2 usage or document
errors (nothing ran), 125 the sandbox could not run a block.
See docs/check.md.

Flags:
`

// checkEnv is the environment of checked blocks unless --env changes it:
// what makes output vary from one host or run to the next, fixed.
var checkEnv = []string{"TZ=UTC", "LC_ALL=C.UTF-8", "PYTHONHASHSEED=0"}

// envFlag collects --env KEY=VALUE, which add to or replace checkEnv's.
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, ",") }
func (e *envFlag) Set(s string) error {
	k, _, ok := strings.Cut(s, "=")
	if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.ContainsRune(s, 0) {
		return fmt.Errorf("%q is not KEY=VALUE", s)
	}
	*e = append(*e, s)
	return nil
}

// mergeEnv returns base with each of extra's variables added or replacing
// base's of the same name, in a stable order.
func mergeEnv(base, extra []string) []string {
	out := slices.Clone(base)
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		if i := slices.IndexFunc(out, func(s string) bool { return strings.HasPrefix(s, k+"=") }); i >= 0 {
			out[i] = kv
		} else {
			out = append(out, kv)
		}
	}
	return out
}

// updateFlag is --update (expected blocks that differ) or --update=all
// (and create missing ones).
type updateFlag string

func (u *updateFlag) String() string   { return string(*u) }
func (u *updateFlag) IsBoolFlag() bool { return true }
func (u *updateFlag) Set(s string) error {
	switch s {
	case "true", "changed":
		*u = "changed"
	case "false":
		*u = ""
	case "all":
		*u = "all"
	default:
		return fmt.Errorf("%q: use --update or --update=all", s)
	}
	return nil
}

// checkConfig is everything check is told, gathered from its flags.
type checkConfig struct {
	host    hostFlags
	net     netFlags
	limits  sandbox.Limits
	jobs    int
	include globList
	exclude globList
	junit   string
	json    bool
	update  updateFlag
	env     []string
	images  []string
	paths   []string
	// preload lists the modules each language's warm interpreters import;
	// a language that is absent imports none.
	preload map[string][]string
}

// gatherCheck reads check's flags and environment into a checkConfig.
func gatherCheck(args []string) (checkConfig, int, bool) {
	var c checkConfig
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	var (
		timeout = fs.Duration("timeout", 0, "wall-clock limit of each block unless its timeout= says (default "+sandbox.DefaultLimits.Timeout.String()+")")
		env     envFlag
		images  = fs.String("images", "", "comma-separated images that blocks may name with image= (default: none; blocks run in their language's image)")
		preload = fs.String("preload", "", "modules the warm interpreters import, as `LANG=MOD,MOD;LANG=...` (default: none, which keeps each warm start cheapest)")
	)
	settings := registerWithEnv(fs, c.host.register, c.net.register)
	fs.Usage = func() { fmt.Fprint(fs.Output(), checkUsage); printSettings(fs, settings) }
	registerLimits(fs, &c.limits)
	fs.IntVar(&c.jobs, "j", runtime.NumCPU(), "blocks of different documents and sessions run in parallel")
	fs.Var(&c.include, "include", "check only documents whose path below PATH matches this glob, e.g. 'docs/**/*.md' (repeatable)")
	fs.Var(&c.exclude, "exclude", "skip documents whose path below PATH matches this glob (repeatable)")
	fs.StringVar(&c.junit, "junit", "", "also write a JUnit XML report to this `file`")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per block and a summary, one per line, instead of the human report")
	fs.Var(&c.update, "update", "rewrite expected-output blocks that differ with what the programs printed; --update=all also adds them to blocks that have none")
	fs.Var(&env, "env", "KEY=VALUE added to the environment of checked blocks, replacing the default's of that name (repeatable)")
	if code, done := parseFlags(fs, args); done {
		return c, code, true
	}
	if err := applySettings(fs, settings, os.LookupEnv, ""); err != nil {
		return c, fail(usageError("%v", err)), true
	}
	switch {
	case *timeout < 0:
		return c, fail(&sandbox.InputError{Field: "timeout", Msg: "is negative; give a positive duration such as 30s"}), true
	case c.jobs < 1:
		return c, fail(usageError("-j %d: give 1 or more", c.jobs)), true
	case fs.NArg() == 0:
		return c, fail(usageError("no PATH given; name the Markdown files or directories to check, e.g. `safe-run check docs/`")), true
	}
	c.limits.Timeout = *timeout
	var err error
	if c.preload, err = parsePreload(*preload); err != nil {
		return c, fail(err), true
	}
	c.env = mergeEnv(checkEnv, env)
	c.images = splitList(*images, ",")
	c.paths = fs.Args()
	return c, 0, false
}

// checkDoc is one document: its blocks and the jobs they become.
type checkDoc struct {
	path   string
	data   []byte
	mode   os.FileMode
	blocks []snippets.Block
	jobs   []sandbox.Job // per block; zero for a skipped block
	first  int           // index of its first block among all reports
}

// checkUnit is what one worker runs in order: one block, or the blocks of
// one session of one document.
type checkUnit struct {
	doc     int
	blocks  []int // indexes into the document's blocks
	session string
}

func cmdCheck(args []string) int {
	c, code, done := gatherCheck(args)
	if done {
		return code
	}
	policy := sandbox.Policy{Languages: c.host.languageTable(), Default: c.limits, Images: c.images}
	if err := c.net.policy(&policy); err != nil {
		return fail(err)
	}
	if _, _, err := policy.Check(sandbox.Job{Language: policy.LanguageNames()[0], Code: "probe", Limits: c.limits}); err != nil {
		return fail(usageError("%v", err))
	}
	paths, err := findDocuments(c.paths, c.include, c.exclude)
	if err != nil {
		return fail(err)
	}
	if len(paths) == 0 {
		return fail(usageError("no Markdown documents (.md, .markdown) found in %s", strings.Join(c.paths, " ")))
	}
	docs, docErrs := loadDocuments(paths, policy, c)
	if len(docErrs) > 0 {
		for _, err := range docErrs {
			fmt.Fprintln(os.Stderr, "safe-run check:", visible(oneLine(err.Error())))
		}
		if os.Getenv("GITHUB_ACTIONS") == "true" {
			fmt.Print(documentAnnotations(docErrs))
		}
		fmt.Fprintf(os.Stderr, "safe-run check: %d document error(s); nothing ran\n", len(docErrs))
		return exitUsage
	}
	units, total := planUnits(docs)

	cfg, err := c.host.runtimeConfig()
	if err != nil {
		return fail(err)
	}
	cfg.Engine.Policy.Default, cfg.Engine.Policy.Images = c.limits, c.images
	cfg.Engine.Policy.Network, cfg.Engine.Policy.NetworkLimits = policy.Network, policy.NetworkLimits
	cfg.Engine.Policy.Packages, cfg.Engine.Policy.PackageIndex = policy.Packages, policy.PackageIndex
	c.net.configure(&cfg)
	if networked(docs) {
		if err := c.net.checkHost(cfg); err != nil {
			return fail(err)
		}
	}
	cfg.Engine.Pool = checkPool(docs, c.jobs, c.env, c.preload)
	if len(cfg.Engine.Pool.Size) > 0 {
		cfg.Backend.CheckpointDir = checkpointDir(c.host.cacheDir)
	}
	cfg.Engine.Sessions = defaultSessions
	cfg.Engine.Sessions.MaxSessions = max(cfg.Engine.Sessions.MaxSessions, c.jobs)
	rt, err := newBackend(cfg)
	if err != nil {
		return fail(err)
	}
	defer closeBackend(rt)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = sandbox.WithClient(ctx, sandbox.Client{Name: "safe-run check", Version: version})

	start := time.Now()
	reports := make([]blockReport, total)
	out := newCheckPrinter(c, reports)
	runUnits(ctx, rt, docs, units, reports, c, out.done)
	out.wait()
	sum := summarize(reports, time.Since(start))

	if c.update != "" {
		if err := updateDocuments(docs, reports, c.update == "all"); err != nil {
			return fail(err)
		}
	}
	if c.json {
		if err := writeJSONReport(os.Stdout, reports, sum); err != nil {
			return fail(err)
		}
	} else {
		fmt.Println(sum.line())
		if os.Getenv("GITHUB_ACTIONS") == "true" {
			fmt.Print(githubAnnotations(reports))
		}
	}
	if c.junit != "" {
		if err := writeJUnit(c.junit, reports, sum); err != nil {
			return fail(err)
		}
	}
	return sum.ExitCode
}

// loadDocuments reads and parses paths and turns their blocks into jobs;
// every problem found is a document error, with its file and line.
func loadDocuments(paths []string, policy sandbox.Policy, c checkConfig) ([]checkDoc, []error) {
	var docs []checkDoc
	var errs []error
	first := 0
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		data, err := readFileCapped(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		blocks, err := snippets.Parse(p, data, policy.LanguageNames())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d := checkDoc{path: p, data: data, mode: fi.Mode().Perm(), blocks: blocks, jobs: make([]sandbox.Job, len(blocks)), first: first}
		first += len(blocks)
		for i, b := range blocks {
			if b.Attrs.Skip {
				continue
			}
			job, err := blockJob(p, b, policy, c)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			d.jobs[i] = job
		}
		docs = append(docs, d)
	}
	return docs, errs
}

// blockJob is the job that runs block b of the document at path.
func blockJob(path string, b snippets.Block, policy sandbox.Policy, c checkConfig) (sandbox.Job, error) {
	docErr := func(format string, args ...any) error {
		return &snippets.Error{Path: path, Line: b.Line, Msg: fmt.Sprintf(format, args...)}
	}
	job := sandbox.Job{Language: b.Language, Code: b.Code, Image: b.Attrs.Image, Env: c.env, Limits: c.limits}
	if b.Attrs.Timeout > 0 {
		job.Limits.Timeout = b.Attrs.Timeout
	}
	if b.Attrs.Session != "" && b.Attrs.Image != "" {
		return job, docErr("image= cannot be given to a block of a session: a session runs in its language's image")
	}
	if b.Attrs.Session != "" && len(b.Attrs.Network) > 0 {
		return job, docErr("network= cannot be given to a block of a session: run the block without session=")
	}
	job.Network = b.Attrs.Network
	dir := filepath.Dir(path)
	for _, name := range b.Attrs.Files {
		data, exec, err := readDocumentFile(dir, name)
		if err != nil {
			return job, docErr("files=%s: %v", name, err)
		}
		job.Files = append(job.Files, sandbox.File{Path: filepath.ToSlash(filepath.Clean(name)), Data: data, Executable: exec})
	}
	if b.Attrs.Stdin != "" {
		data, _, err := readDocumentFile(dir, b.Attrs.Stdin)
		if err != nil {
			return job, docErr("stdin=%s: %v", b.Attrs.Stdin, err)
		}
		job.Stdin = data
	}
	if _, _, err := policy.Check(job); err != nil {
		return job, docErr("%v", err)
	}
	return job, nil
}

// readDocumentFile reads name, relative to a document's directory dir. It
// must stay inside dir, links resolved: a document is not trusted to pick
// host files (it may come from a pull request).
func readDocumentFile(dir, name string) ([]byte, bool, error) {
	if filepath.IsAbs(name) || !filepath.IsLocal(name) {
		return nil, false, errors.New("must be a path inside the document's directory")
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, false, err
	}
	real, err := filepath.EvalSymlinks(filepath.Join(dir, name))
	if err != nil {
		return nil, false, fmt.Errorf("not found next to the document (%v)", errors.Unwrap(err))
	}
	if rel, err := filepath.Rel(root, real); err != nil || !filepath.IsLocal(rel) {
		return nil, false, errors.New("is a link out of the document's directory")
	}
	fi, err := os.Stat(real)
	if err != nil {
		return nil, false, err
	}
	if !fi.Mode().IsRegular() {
		return nil, false, errors.New("is not a regular file")
	}
	data, err := readFileCapped(real)
	if err != nil {
		return nil, false, errors.New(oneLine(err.Error()))
	}
	return data, fi.Mode()&0o111 != 0, nil
}

// planUnits groups the blocks into units: each block alone, except that
// the blocks of one session of one document run in one unit, in order. It
// returns them and the number of blocks.
func planUnits(docs []checkDoc) ([]checkUnit, int) {
	var units []checkUnit
	total := 0
	for di, d := range docs {
		sessions := map[string]int{} // name → index in units
		for bi, b := range d.blocks {
			total++
			if b.Attrs.Skip {
				continue
			}
			name := b.Attrs.Session
			if name == "" {
				units = append(units, checkUnit{doc: di, blocks: []int{bi}})
				continue
			}
			u, ok := sessions[name]
			if !ok {
				u = len(units)
				sessions[name] = u
				units = append(units, checkUnit{doc: di, session: name})
			}
			units[u].blocks = append(units[u].blocks, bi)
		}
	}
	return units, total
}

// checkPool sizes the warm pool: per language, as many sandboxes as blocks
// may run at once (-j), for the one-shot blocks in their language's image,
// their interpreters started with env. As many refills as workers run at
// once, and a block that finds the pool empty waits for the refill under
// way (a restore, faster than the cold start it would otherwise make beside
// it on the same CPUs): a suite of short blocks then costs warm starts.
// The warm interpreters import nothing unless --preload says: a restore of
// one with pandas imported costs more than the import saves a block that
// does not use it.
func checkPool(docs []checkDoc, jobs int, env []string, preload map[string][]string) poolConfig {
	count := map[string]int{}
	for _, d := range docs {
		for i, b := range d.blocks {
			if !b.Attrs.Skip && b.Attrs.Session == "" && d.jobs[i].Image == "" {
				count[b.Language]++
			}
		}
	}
	size := map[string]int{}
	for lang, n := range count {
		size[lang] = min(n, jobs)
	}
	modules := map[string][]string{}
	for lang := range size {
		modules[lang] = preload[lang] // none unless --preload names some
	}
	return poolConfig{Size: size, Env: env, Refills: jobs, AwaitRefill: checkAwaitRefill, Preload: modules}
}

// checkAwaitRefill bounds a block's wait for a refill: a refill slower
// than this is broken, and the block starts cold instead.
const checkAwaitRefill = 30 * time.Second

// runUnits runs the units on c.jobs workers, fills reports (indexed as the
// documents' blocks, in order) and calls done(i) as report i is final.
func runUnits(ctx context.Context, rt backend, docs []checkDoc, units []checkUnit, reports []blockReport, c checkConfig, done func(int)) {
	for _, d := range docs {
		for i, b := range d.blocks {
			reports[d.first+i] = blockReport{File: d.path, Line: b.Line, Language: b.Language, Session: b.Attrs.Session, ExitCode: -1}
			if b.Attrs.Skip {
				reports[d.first+i].Outcome, reports[d.first+i].Message = outcomeSkipped, "marked skip"
				done(d.first + i)
			}
		}
	}
	work := make(chan checkUnit)
	var wg sync.WaitGroup
	for range min(c.jobs, max(len(units), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range work {
				runUnit(ctx, rt, docs[u.doc], u, reports, c.update, done)
			}
		}()
	}
	for _, u := range units {
		work <- u
	}
	close(work)
	wg.Wait()
}

// runUnit runs one unit's blocks in order.
func runUnit(ctx context.Context, rt backend, d checkDoc, u checkUnit, reports []blockReport, update updateFlag, done func(int)) {
	var session string
	var sessionErr error
	if u.session != "" {
		first := d.jobs[u.blocks[0]]
		limits := first.Limits
		limits.Timeout = 0
		info, err := rt.CreateSession(ctx, sandbox.SessionSpec{Language: first.Language, Limits: limits})
		if err != nil {
			sessionErr = fmt.Errorf("start session %s: %w", u.session, err)
		} else {
			session = info.ID
			defer func() {
				end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
				defer cancel()
				_ = rt.CloseSession(end, session)
			}()
		}
	}
	for _, bi := range u.blocks {
		r := &reports[d.first+bi]
		var res sandbox.Result
		err := sessionErr
		if err == nil {
			if session != "" {
				res, err = rt.RunInSession(ctx, session, d.jobs[bi])
			} else {
				res, err = rt.Run(ctx, d.jobs[bi])
			}
		}
		if err != nil {
			r.Outcome, r.Message = outcomeError, oneLine(withHint(err).Error())
		} else {
			b := d.blocks[bi]
			judge(r, b, res, update != "")
			// --update=all gives a passing block that printed something
			// an expected block.
			r.Updated = r.Updated || (update == "all" && b.Expected == nil && r.Outcome == outcomePassed && r.Stdout != "")
		}
		done(d.first + bi)
	}
}

// judge decides a block's outcome from its run's result: the exit it
// expects (0, non-zero for should-fail, N for exit=N), then its expected
// output. With update, a block whose exit was as expected passes, and its
// output is kept for its expected block.
func judge(r *blockReport, b snippets.Block, res sandbox.Result, update bool) {
	r.Status, r.ExitCode, r.DurationMS = string(res.Status), res.ExitCode, res.DurationMS
	r.Stdout, r.Stderr = res.Stdout, res.Stderr
	fail := func(format string, args ...any) {
		r.Outcome, r.Message = outcomeFailed, fmt.Sprintf(format, args...)
	}
	switch res.Status {
	case sandbox.StatusOK, sandbox.StatusError:
	case sandbox.StatusSandboxError:
		r.Outcome, r.Message = outcomeError, res.Message
		if h := hint(res.Err); h != "" {
			r.Message += "; " + h
		}
		return
	default: // timeout, oom, killed: a limit, never the expected failure
		fail("%s: %s", res.Status, res.Message)
		return
	}
	switch a := b.Attrs; {
	case a.Exit != nil && res.ExitCode != *a.Exit:
		fail("exit code %d, want %d (exit=%d)", res.ExitCode, *a.Exit, *a.Exit)
		return
	case a.Exit == nil && a.ShouldFail && res.ExitCode == 0:
		fail("exit code 0, want a failure (should-fail)")
		return
	case a.Exit == nil && !a.ShouldFail && res.ExitCode != 0:
		fail("exit code %d, want 0", res.ExitCode)
		return
	}
	r.Outcome = outcomePassed
	if b.Expected == nil {
		return
	}
	got, stream := res.Stdout, "stdout"
	if b.Expected.Stderr {
		got, stream = res.Stderr, "stderr"
	}
	if snippets.Match(b.Expected.Text, got, b.Expected.Regex) {
		return
	}
	if update && !b.Expected.Regex {
		r.Updated = true
		return
	}
	fail("%s differs from the expected output (line %d)", stream, b.Expected.Line)
	if b.Expected.Regex {
		r.Diff = snippets.DiffRegex(b.Expected.Text, got)
	} else {
		r.Diff = snippets.Diff(b.Expected.Text, got)
	}
}

// updateDocuments rewrites the expected output of the blocks marked
// updated, or adds it where they have none (all), each document replaced
// whole, only if it changed.
func updateDocuments(docs []checkDoc, reports []blockReport, all bool) error {
	for _, d := range docs {
		var outputs []snippets.Output
		for i, b := range d.blocks {
			r := reports[d.first+i]
			if !r.Updated {
				continue
			}
			text := r.Stdout
			if b.Expected != nil && b.Expected.Stderr {
				text = r.Stderr
			}
			outputs = append(outputs, snippets.Output{Block: i, Text: text})
		}
		if len(outputs) == 0 {
			continue
		}
		data := snippets.Update(d.data, d.blocks, outputs, all)
		if string(data) == string(d.data) {
			continue
		}
		if err := replaceFile(d.path, data, d.mode); err != nil {
			return fmt.Errorf("update %s: %w", d.path, err)
		}
	}
	return nil
}

// replaceFile writes data to path through a new file renamed over it, so
// that an interrupted update leaves the old document whole.
func replaceFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// documentAnnotations marks document errors on the pull request.
func documentAnnotations(errs []error) string {
	var b strings.Builder
	for _, err := range errs {
		var de *snippets.Error
		if errors.As(err, &de) {
			fmt.Fprintf(&b, "::error file=%s,line=%d,title=safe-run check: document error::%s\n", ghProperty(de.Path), de.Line, ghData(de.Msg))
		} else {
			fmt.Fprintf(&b, "::error title=safe-run check: document error::%s\n", ghData(oneLine(err.Error())))
		}
	}
	return b.String()
}

// checkPrinter prints the human report in document order as blocks
// finish, and progress on stderr when that is a terminal.
type checkPrinter struct {
	mu       sync.Mutex
	human    *humanReport
	progress io.Writer // nil: none
	total    int
	finished []bool
	next     int // the next report to print
	count    int
	reports  []blockReport
	all      chan struct{}
}

func newCheckPrinter(c checkConfig, reports []blockReport) *checkPrinter {
	total := len(reports)
	p := &checkPrinter{total: total, reports: reports, finished: make([]bool, total), all: make(chan struct{})}
	if !c.json {
		p.human = &humanReport{w: os.Stdout, colour: useColour(os.Stdout)}
	}
	if isTerminal(os.Stderr) && total > 1 {
		p.progress = os.Stderr
	}
	if total == 0 {
		close(p.all)
	}
	return p
}

// done marks report i final and prints what is now next in order.
func (p *checkPrinter) done(i int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished[i] = true
	p.count++
	if p.progress != nil {
		fmt.Fprint(p.progress, "\r\x1b[K")
	}
	for p.next < p.total && p.finished[p.next] {
		if p.human != nil {
			p.human.block(p.reports[p.next])
		}
		p.next++
	}
	if p.progress != nil && p.count < p.total {
		fmt.Fprintf(p.progress, "checking: %d/%d blocks done", p.count, p.total)
	}
	if p.count == p.total {
		close(p.all)
	}
}

// wait returns once every report is final.
func (p *checkPrinter) wait() { <-p.all }

// networked says whether a block of docs asks for a network (network=).
func networked(docs []checkDoc) bool {
	for _, d := range docs {
		for _, j := range d.jobs {
			if len(j.Network) > 0 {
				return true
			}
		}
	}
	return false
}
