package kubernetes_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/safe-run/safe-run/bundle"
	"github.com/safe-run/safe-run/runtime/kubernetes"
	"github.com/safe-run/safe-run/sandbox"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var testSpecConfig = kubernetes.SpecConfig{
	Namespace:    "safe-run",
	RuntimeClass: kubernetes.DefaultRuntimeClass,
	Image:        "registry.example/safe-run/default:1",
	PodLifetime:  kubernetes.DefaultPodLifetime,
}

// checkedJob is a Python job with limits completed by the default policy,
// as the engine hands it to the backend.
func checkedJob(t *testing.T, limits sandbox.Limits) sandbox.Job {
	t.Helper()
	job, _, err := sandbox.Policy{}.Check(sandbox.Job{Language: "python", Code: "print(1)", Limits: limits})
	if err != nil {
		t.Fatalf("Policy.Check: %v", err)
	}
	return job
}

// TestGolden compares every object the backend creates with a reviewed
// copy. Run "go test ./runtime/kubernetes -run TestGolden -update" to
// rewrite the files, then review the difference before keeping it.
func TestGolden(t *testing.T) {
	custom := sandbox.Limits{MemoryBytes: 256 * sandbox.MiB, CPUs: 1.5, WorkspaceBytes: 8 * sandbox.MiB, TmpBytes: 4 * sandbox.MiB}
	created := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		golden string
		limits sandbox.Limits
	}{
		{"python-default.golden.json", sandbox.Limits{}},
		{"python-custom.golden.json", custom},
	} {
		t.Run(tt.golden, func(t *testing.T) {
			job := checkedJob(t, tt.limits)
			tmpl, err := kubernetes.Template(job, testSpecConfig)
			if err != nil {
				t.Fatal(err)
			}
			pool := kubernetes.WarmPool(tmpl, 2)
			claim := kubernetes.Claim(pool, kubernetes.ClaimSpec{Name: "safe-run-0123456789ab", Language: job.Language,
				Owner: "server-a", Created: created, Lifetime: time.Hour})
			got, err := json.MarshalIndent([]any{tmpl, pool, claim, kubernetes.DenyAll(testSpecConfig.Namespace)}, "", "\t")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("objects differ from %s (run with -update and review the diff):\n%s", path, got)
			}
		})
	}
}

// TestPodPosture checks the hardening the issue asks for one by one, so
// that a golden file rewritten carelessly cannot drop one unnoticed.
func TestPodPosture(t *testing.T) {
	job := checkedJob(t, sandbox.Limits{})
	spec, err := kubernetes.PodSpec(job, testSpecConfig)
	if err != nil {
		t.Fatal(err)
	}
	c := spec.Containers[0]
	sc, psc := c.SecurityContext, spec.SecurityContext
	mem := c.Resources.Limits[corev1.ResourceMemory]
	workspace := spec.Volumes[0].EmptyDir
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"runtimeClassName gvisor", spec.RuntimeClassName != nil && *spec.RuntimeClassName == "gvisor"},
		{"runAsUser 65534", *psc.RunAsUser == 65534 && *sc.RunAsUser == 65534},
		{"runAsGroup 65534", *psc.RunAsGroup == 65534 && *sc.RunAsGroup == 65534},
		{"runAsNonRoot", *psc.RunAsNonRoot && *sc.RunAsNonRoot},
		{"readOnlyRootFilesystem", *sc.ReadOnlyRootFilesystem},
		{"no privilege escalation", !*sc.AllowPrivilegeEscalation && !*sc.Privileged},
		{"all capabilities dropped", len(sc.Capabilities.Drop) == 1 && sc.Capabilities.Drop[0] == "ALL" && len(sc.Capabilities.Add) == 0},
		{"seccomp RuntimeDefault", psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no service account token", !*spec.AutomountServiceAccountToken},
		{"no service links", !*spec.EnableServiceLinks},
		{"no host namespaces", !spec.HostNetwork && !spec.HostPID && !spec.HostIPC && !*spec.ShareProcessNamespace},
		{"workspace in memory, sized", workspace.Medium == corev1.StorageMediumMemory && workspace.SizeLimit.Value() == job.Limits.WorkspaceBytes},
		{"tmp in memory, sized", spec.Volumes[1].EmptyDir.Medium == corev1.StorageMediumMemory && spec.Volumes[1].EmptyDir.SizeLimit.Value() == job.Limits.TmpBytes},
		{"memory limit is the job's plus gVisor's headroom", mem.Value() == job.Limits.MemoryBytes+bundle.MemoryHeadroom},
		{"requests equal limits", c.Resources.Requests.Memory().Equal(*c.Resources.Limits.Memory()) && c.Resources.Requests.Cpu().Equal(*c.Resources.Limits.Cpu())},
		{"ephemeral storage bounded", !c.Resources.Limits.StorageEphemeral().IsZero()},
		{"activeDeadlineSeconds backstop", spec.ActiveDeadlineSeconds != nil && *spec.ActiveDeadlineSeconds > 0},
		{"the agent waits", strings.Join(c.Command, " ") == bundle.AgentPath+" --wait"},
		{"never restarted", spec.RestartPolicy == corev1.RestartPolicyNever},
	} {
		if !tt.ok {
			t.Errorf("%s: not so in %+v", tt.name, spec)
		}
	}
}

func TestTemplateNameFollowsThePod(t *testing.T) {
	def := checkedJob(t, sandbox.Limits{})
	small := checkedJob(t, sandbox.Limits{MemoryBytes: 128 * sandbox.MiB})
	other := testSpecConfig
	other.Image = "registry.example/safe-run/default:2"
	a, b, c := kubernetes.TemplateName(def, testSpecConfig), kubernetes.TemplateName(small, testSpecConfig), kubernetes.TemplateName(def, other)
	if a == b || a == c {
		t.Errorf("templates of different Pods share a name: %s %s %s", a, b, c)
	}
	if again := kubernetes.TemplateName(checkedJob(t, sandbox.Limits{}), testSpecConfig); again != a {
		t.Errorf("the same job got two names: %s and %s", a, again)
	}
	if len(a) > 63 || !strings.HasPrefix(a, "safe-run-python-") {
		t.Errorf("name %q is not a DNS label of the language", a)
	}
}

func TestPodSpecRefusesIncompleteInput(t *testing.T) {
	for _, tt := range []struct {
		name string
		job  sandbox.Job
		cfg  kubernetes.SpecConfig
	}{
		{"no limits", sandbox.Job{Language: "python"}, testSpecConfig},
		{"no image", checkedJob(t, sandbox.Limits{}), kubernetes.SpecConfig{RuntimeClass: "gvisor", PodLifetime: time.Hour}},
		{"no runtime class", checkedJob(t, sandbox.Limits{}), kubernetes.SpecConfig{Image: "x", PodLifetime: time.Hour}},
	} {
		if _, err := kubernetes.PodSpec(tt.job, tt.cfg); err == nil {
			t.Errorf("%s: PodSpec accepted it", tt.name)
		}
	}
}
