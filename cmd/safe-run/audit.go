package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/safe-run/safe-run/audit"
	"github.com/safe-run/safe-run/sandbox"
)

const auditUsage = `Usage: safe-run audit verify FILE

Checks the hash chain of the audit log FILE (written by serve or run with
--audit-log) together with its rotated files FILE.1, FILE.2, … (oldest
first): every line must be the next record and carry the SHA-256 of the line
before it, and the first must be record 1 (or, once --audit-max-files
deleted the oldest files, the record the last "audit_pruned" record names).
Every line must be a record of at most 8 MiB, the rule serve and run apply
to the last line before they append to a log. It prints the number of records
and the hash of the last line (the head), and exits 0; at the first line
where the chain breaks — a line edited, dropped, reordered or cut, or a
rotated file missing — it names that line and exits 1.

A chain cannot show that lines were removed from its very end: compare the
head printed here with the last head the server logged ("audit log closed"
or "audit log rotated").
`

// auditFlags configure the audit log of serve and run.
type auditFlags struct {
	path     string
	maxSize  int64
	maxFiles int
	code     bool
}

func (a *auditFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.path, "audit-log", "", "append a hash-chained JSON record of every run and session event to this `file`")
	a.maxSize = 100 * sandbox.MiB
	fs.Var(sizeFlag{&a.maxSize}, "audit-max-size", "rotate the audit log to FILE.1, FILE.2, … before it grows past this `size`")
	fs.IntVar(&a.maxFiles, "audit-max-files", 10, "keep the newest `N` rotated audit log files, deleting older ones (0 keeps all)")
	fs.BoolVar(&a.code, "audit-code", false, "keep each run's code in the audit log, not only its SHA-256")
}

// open opens the audit log, or returns nil when none is configured.
func (a *auditFlags) open(logger *slog.Logger) (*audit.Log, error) {
	if a.path == "" {
		return nil, nil
	}
	if a.maxFiles < 0 {
		return nil, usageError("--audit-max-files %d: give the number of rotated files to keep, or 0 to keep them all", a.maxFiles)
	}
	return audit.Open(audit.Options{Path: a.path, MaxBytes: a.maxSize, MaxFiles: a.maxFiles, IncludeCode: a.code, Logger: logger})
}

// closeAuditLog closes l, logging the chain's head so that a later verify
// can tell the end of the log is intact.
func closeAuditLog(l *audit.Log, path string, logger *slog.Logger) {
	if l == nil {
		return
	}
	seq, head := l.Head()
	logger.Info("audit log closed", "file", path, "last_seq", seq, "head", head)
	if err := l.Close(); err != nil {
		logger.Error("close audit log", "err", err)
	}
}

// newRecorder returns the decorator that records every run and session
// event in l, or nil when there is no log; the caller sets what it wraps.
func newRecorder(l *audit.Log, logger *slog.Logger) *audit.Runner {
	if l == nil {
		return nil
	}
	return &audit.Runner{Log: l, Logger: logger}
}

// audited returns runner and sessions (which may be nil) as rec records
// them; unchanged when rec is nil.
func audited(rec *audit.Runner, runner sandbox.Runner, sessions sandbox.Sessions) (sandbox.Runner, sandbox.Sessions) {
	if rec == nil {
		return runner, sessions
	}
	rec.Runner, rec.Sessions = runner, sessions
	if sessions == nil {
		return rec, nil
	}
	return rec, rec
}

// auditHint adds what to do to an error of a run the audit log stopped.
func auditHint(err error) error {
	var failed *audit.FailedError
	if errors.As(err, &failed) {
		return fmt.Errorf("%w; make the --audit-log file writable (disk space, permissions) and run again", err)
	}
	return err
}

func cmdAudit(args []string) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Print(auditUsage)
		return 0
	}
	if len(args) != 2 || args[0] != "verify" {
		fmt.Fprint(os.Stderr, auditUsage)
		return exitUsage
	}
	path := args[1]
	sum, err := audit.Verify(path)
	var bad *audit.VerifyError
	switch {
	case errors.As(err, &bad):
		fmt.Fprintf(os.Stderr, "safe-run audit verify: %v\n", err)
		return 1
	case err != nil:
		return fail(usageError("%v", err))
	}
	fmt.Printf("%s: ok: %d records in %d file(s), first record %d, last record %d, head %s\n", path, sum.Records, len(sum.Files), sum.FirstSeq, sum.LastSeq, sum.Head)
	return 0
}
