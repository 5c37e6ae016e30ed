// Package deploy holds the Kubernetes manifests of safe-run (kustomize
// data, beside this file) and the test that applies them to a real API
// server: the manifests are data, and only an API server can say they are
// right. It has no code of its own.
package deploy
