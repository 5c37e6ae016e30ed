package kubetest

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

func TestMain(m *testing.M) { Main(m) }

// TestShared checks that Shared hands every test the same control plane,
// each Namespace its own, and that the controller manager runs (it makes
// each namespace's default ServiceAccount).
func TestShared(t *testing.T) {
	var first *Cluster
	namespaces := map[string]bool{}
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			c := Shared(t)
			if first == nil {
				first = c
			} else if c != first {
				t.Fatalf("Shared returned a second cluster")
			}
			ns := c.Namespace(t)
			if namespaces[ns] {
				t.Fatalf("Namespace returned %s twice", ns)
			}
			namespaces[ns] = true
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
				return err == nil, nil
			})
			if err != nil {
				t.Fatalf("no default ServiceAccount in %s: %v", ns, err)
			}
		})
	}
}
