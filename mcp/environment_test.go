package mcp

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/safe-run/safe-run/sandbox"
)

func TestDescribeLanguages(t *testing.T) {
	tests := []struct {
		name  string
		langs []LanguageInfo
		want  string
	}{
		{
			name: "python with notable packages",
			langs: []LanguageInfo{{Name: "python", Version: "3.11.2", Packages: map[string]string{
				"numpy": "1.24.2", "pandas": "1.5.3", "matplotlib": "3.6.3", "Pillow": "9.4.0",
				"SciPy": "1.10.1", "attrs": "22.2.0", "pip": "23.0.1",
			}}},
			want: "python (Python 3.11.2 with matplotlib 3.6.3, numpy 1.24.2, pandas 1.5.3, pillow 9.4.0, scipy 1.10.1, and the standard library)",
		},
		{
			name: "python with every notable package",
			langs: []LanguageInfo{{Name: "python", Version: "3.12.1", Packages: map[string]string{
				"numpy": "1", "pandas": "2", "matplotlib": "3", "scipy": "4", "sympy": "5", "scikit-learn": "6", "pillow": "7", "requests": "8", "pytest": "9",
			}}},
			want: "python (Python 3.12.1 with matplotlib 3, numpy 1, pandas 2, pillow 7, pytest 9, requests 8, scikit-learn 6, scipy 4, sympy 5, and the standard library)",
		},
		{
			name:  "python without notable packages",
			langs: []LanguageInfo{{Name: "python", Version: "3.11.2", Packages: map[string]string{"pip": "23.0.1"}}},
			want:  "python (Python 3.11.2)",
		},
		{
			name:  "python without packages",
			langs: []LanguageInfo{{Name: "python", Version: "3.11.2"}},
			want:  "python (Python 3.11.2)",
		},
		{
			name:  "python without a version",
			langs: []LanguageInfo{{Name: "python", Packages: map[string]string{"numpy": "1.24.2"}}},
			want:  "python",
		},
		{
			name:  "node",
			langs: []LanguageInfo{{Name: "node", Version: "18.19.0"}},
			want:  "node (Node.js 18.19.0, CommonJS, built-in modules only)",
		},
		{
			name:  "bash",
			langs: []LanguageInfo{{Name: "bash", Version: "5.2.15"}},
			want:  "bash (GNU bash 5.2.15 with coreutils)",
		},
		{
			name:  "unknown language",
			langs: []LanguageInfo{{Name: "ruby", Version: "3.1.2"}},
			want:  "ruby (3.1.2)",
		},
		{
			name:  "unknown language without a version",
			langs: []LanguageInfo{{Name: "ruby"}},
			want:  "ruby",
		},
		{
			name: "several",
			langs: []LanguageInfo{
				{Name: "python", Version: "3.11.2", Packages: map[string]string{"numpy": "1.24.2"}},
				{Name: "node"},
				{Name: "bash", Version: "5.2.15"},
				{Name: "lua", Version: "5.4"},
			},
			want: "python (Python 3.11.2 with numpy 1.24.2, and the standard library); node; bash (GNU bash 5.2.15 with coreutils); lua (5.4)",
		},
		{name: "none", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := Environment{Languages: tt.langs}
			if got := env.describeLanguages(); got != tt.want {
				t.Errorf("describeLanguages() =\n%q\nwant\n%q", got, tt.want)
			}
			var names []string
			for _, l := range tt.langs {
				names = append(names, l.Name)
			}
			if got := env.names(); !slices.Equal(got, names) {
				t.Errorf("names() = %v, want %v", got, names)
			}
		})
	}
}

func TestProbeEnvironment(t *testing.T) {
	policy := sandbox.Policy{
		Languages: []sandbox.Language{
			{Name: "python", Filename: "main.py", Command: []string{"python3", "-u", "main.py"}},
			{Name: "py", Filename: "main.py", Command: []string{"python3", "main.py"}},
			{Name: "node", Filename: "main.js", Command: []string{"node", "main.js"}},
			{Name: "bash", Filename: "main.sh", Command: []string{"bash", "main.sh"}},
			{Name: "ruby", Filename: "main.rb", Command: []string{"ruby", "main.rb"}},
		},
		Max:         sandbox.Limits{Timeout: 10 * time.Minute},
		OutputFiles: sandbox.OutputFileLimits{MaxFiles: 4},
	}
	runner := &fakeRunner{respond: func(job sandbox.Job) (sandbox.Result, error) {
		switch job.Language {
		case "python":
			return sandbox.Result{Status: sandbox.StatusOK, Stdout: `{"version": "3.11.2", "packages": {"numpy": "1.24.2"}}` + "\n"}, nil
		case "py":
			// A probe that claims another name keeps the language's own.
			return sandbox.Result{Status: sandbox.StatusOK, Stdout: `{"name": "other", "version": "3.12.0"}`}, nil
		case "node":
			return sandbox.Result{Status: sandbox.StatusOK, Stdout: `{"version": "18.19.0"}`}, nil
		case "bash":
			return sandbox.Result{Status: sandbox.StatusError, ExitCode: 127, Stdout: `{"version": "5.2.15"}`}, nil
		}
		return sandbox.Result{}, &sandbox.InputError{Field: "language", Msg: "unexpected probe"}
	}, policy: policy}
	env := ProbeEnvironment(t.Context(), runner)

	def, _, hi := policy.Limits()
	want := Environment{
		Languages: []LanguageInfo{
			{Name: "python", Version: "3.11.2", Packages: map[string]string{"numpy": "1.24.2"}},
			{Name: "py", Version: "3.12.0"},
			{Name: "node", Version: "18.19.0"},
			{Name: "bash"}, // its probe failed
			{Name: "ruby"}, // no probe for ruby
		},
		Network: "none", Workdir: "/workspace", OutputDir: "/workspace/out",
		DefaultLimits: limitsInfo(def), MaxLimits: limitsInfo(hi),
		OutputFiles: sandbox.OutputFileLimits{MaxFiles: 4, MaxFileBytes: sandbox.DefaultOutputFiles.MaxFileBytes, MaxTotalBytes: sandbox.DefaultOutputFiles.MaxTotalBytes},
	}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("ProbeEnvironment =\n%+v\nwant\n%+v", env, want)
	}
	if env.MaxLimits.TimeoutSeconds != 600 {
		t.Errorf("max timeout %v, want 600", env.MaxLimits.TimeoutSeconds)
	}

	jobs := runner.Jobs()
	var probed []string
	for _, j := range jobs {
		probed = append(probed, j.Language)
		if j.Code != probes[mustLanguage(t, policy, j.Language).Command[0]] {
			t.Errorf("%s probed with code %q", j.Language, j.Code)
		}
		if j.Limits.Timeout != 30*time.Second {
			t.Errorf("%s probe timeout %v, want 30s", j.Language, j.Limits.Timeout)
		}
	}
	slices.Sort(probed)
	if want := []string{"bash", "node", "py", "python"}; !slices.Equal(probed, want) {
		t.Errorf("probed %v, want %v", probed, want)
	}
}

func mustLanguage(t *testing.T, p sandbox.Policy, name string) sandbox.Language {
	t.Helper()
	l, ok := p.Language(name)
	if !ok {
		t.Fatalf("no language %q", name)
	}
	return l
}

// The zero policy probes the default languages.
func TestProbeEnvironmentDefaultLanguages(t *testing.T) {
	runner := &fakeRunner{err: context.Canceled}
	env := ProbeEnvironment(t.Context(), runner)
	if got, want := env.names(), (sandbox.Policy{}).LanguageNames(); !slices.Equal(got, want) {
		t.Errorf("languages %v, want %v", got, want)
	}
	for _, l := range env.Languages {
		if l.Version != "" || l.Packages != nil {
			t.Errorf("%s has a version or packages although its probe failed: %+v", l.Name, l)
		}
	}
	if n := len(runner.Jobs()); n != len(sandbox.DefaultLanguages) {
		t.Errorf("%d probes, want %d", n, len(sandbox.DefaultLanguages))
	}
	if env.DefaultLimits.TimeoutSeconds != sandbox.DefaultLimits.Timeout.Seconds() {
		t.Errorf("default timeout %v, want %v", env.DefaultLimits.TimeoutSeconds, sandbox.DefaultLimits.Timeout.Seconds())
	}
	if env.OutputFiles != sandbox.DefaultOutputFiles {
		t.Errorf("output files %+v, want %+v", env.OutputFiles, sandbox.DefaultOutputFiles)
	}
}
