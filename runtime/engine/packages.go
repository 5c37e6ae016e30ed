package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/safe-run/safe-run/agent"
	"github.com/safe-run/safe-run/sandbox"
)

// installShare is the part of a run's timeout its install step may take;
// the code gets at least the rest.
const installShare = 3 // of 4

// networkEnv is the environment of a run or session with a network: pip
// and npm install without flags, into places the program's user can write
// (HOME=/tmp's user site, which python puts on sys.path, and node_modules in
// the workspace), from the policy's indexes when it names them.
func (e *Engine) networkEnv(job sandbox.Job) []string {
	if len(job.Network) == 0 {
		return nil
	}
	env := []string{
		// The image's python is Debian's: pip refuses --user installs
		// (PEP 668) unless told the system's packages are not at stake,
		// and they are not: the root is read-only, installs go to /tmp.
		"PIP_BREAK_SYSTEM_PACKAGES=1",
		"PIP_USER=1",
		"PIP_NO_INPUT=1",
		"PIP_DISABLE_PIP_VERSION_CHECK=1",
		"PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
		"npm_config_cache=/tmp/.npm",
		"npm_config_update_notifier=false",
		"npm_config_fund=false",
		"npm_config_audit=false",
	}
	idx := e.cfg.Policy.PackageIndex
	if idx.PipIndexURL != "" {
		env = append(env, "PIP_INDEX_URL="+idx.PipIndexURL)
	}
	if idx.NPMRegistry != "" {
		env = append(env, "npm_config_registry="+idx.NPMRegistry)
	}
	return env
}

// installArgv is the command that installs job's packages with lang's
// installer, nil if the job asks for none.
func installArgv(job sandbox.Job, lang sandbox.Language) []string {
	if len(job.Packages) == 0 || len(lang.Install) == 0 {
		return nil
	}
	return append(append([]string(nil), lang.Install...), job.Packages...)
}

// withPackages adds to req the network's environment (the job's own Env
// last, so it wins) and the step installing the job's packages.
func (e *Engine) withPackages(req agent.Request, job sandbox.Job, lang sandbox.Language) agent.Request {
	if env := e.networkEnv(job); env != nil {
		req.Env = append(env, req.Env...)
	}
	if req.Install = installArgv(job, lang); req.Install != nil {
		req.InstallTimeout = job.Limits.Timeout * installShare / 4
	}
	return req
}

// installFailed is the result of a request whose install step failed: the
// code did not run, and the install's output is in stderr.
func installFailed(res sandbox.Result, exit *agent.Exit, timeout time.Duration) sandbox.Result {
	res.Status = sandbox.StatusError
	res.ExitCode = exit.Code
	switch {
	case exit.TimedOut:
		res.Message = fmt.Sprintf("installing packages failed: no end within %s (of the %s timeout); the code was not run", timeout*installShare/4, timeout)
	case exit.Signal != "":
		res.Signal = exit.Signal
		res.Message = "installing packages failed: the installer was killed by " + exit.Signal + "; the code was not run"
	default:
		res.Message = fmt.Sprintf("installing packages failed: the installer exited with code %d; the code was not run (its output is in stderr)", exit.Code)
	}
	return res
}

// sessionPackages are the packages a session was created with, installed by
// the first cell of each of its sandboxes: a sandbox that replaces a lost
// one starts with an empty /tmp and installs them again.
type sessionPackages struct {
	packages    []string
	installedOn *box // the sandbox whose install succeeded
}

// job is the call's job as its install step and environment see it: the
// session's network, and its packages unless sandbox p has them already.
func (sp *sessionPackages) job(job sandbox.Job, network []string, p *box) sandbox.Job {
	job.Network = network
	if sp.installedOn != p {
		job.Packages = append(slices.Clone(sp.packages), job.Packages...)
	}
	return job
}

// done notes that p installed the session's packages, unless exit says
// the install failed or never ran.
func (sp *sessionPackages) done(p *box, exit *agent.Exit) {
	if exit != nil && !exit.InstallFailed && exit.Error == "" {
		sp.installedOn = p
	}
}
