#!/usr/bin/env bash
# build-control-plane.sh [--print-dir] — build the Kubernetes control plane
# the kubernetes backend's tests run against (etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, kwok and the agent-sandbox
# controller) from the Go module proxy at the versions pinned below, into a
# cache outside the clone keyed by those versions. kwok's stage configs are
# copied from its module beside the binaries (DIR/../kwok-stages).
#
# The scheduler is there because kwok only runs Pods already bound to its
# node; the controller manager for its garbage collector (a deleted Sandbox's
# Pod goes with it) and namespace controller.
#
# Binaries already in the cache are not rebuilt. --print-dir prints the
# directory the binaries are (or would be) in and builds nothing.
# SAFE_RUN_KUBERNETES_CACHE overrides the cache's root
# (default /var/cache/safe-run/kubernetes).
#
# Each part is built from a scratch module in a temporary directory, never
# from this repository's go.mod: etcd and kubernetes carry replace
# directives, so `go install mod@version` refuses them (golang/go#44840), and
# the proxy refuses agent-sandbox's version list, so only an exact `go get`
# in a module resolves it. kubernetes requires its 31 staging modules at
# v0.0.0 and replaces them with ./staging paths; the scratch module replaces
# each with the published v0.X.Y instead, generated from kubernetes' go.mod.
# A cold build (empty module and build caches) took 23 min here on two cores
# shared with other builds (load 7-12; about ten on idle ones), 17 of them
# the three kubernetes binaries; with the binaries cached it does nothing.
set -euo pipefail

ETCD_VERSION=v3.6.8
KUBERNETES_VERSION=v1.37.2
KWOK_VERSION=v0.8.0
AGENT_SANDBOX_VERSION=v0.5.6

key=etcd-$ETCD_VERSION.kube-$KUBERNETES_VERSION.kwok-$KWOK_VERSION.agent-sandbox-$AGENT_SANDBOX_VERSION
root=${SAFE_RUN_KUBERNETES_CACHE:-/var/cache/safe-run/kubernetes}
bin=$root/$key/bin

if [ "${1:-}" = --print-dir ]; then
	echo "$bin"
	exit 0
fi
[ $# -eq 0 ] || { echo "usage: build-control-plane.sh [--print-dir]" >&2; exit 2; }

log() { echo "[control-plane] $*" >&2; }

mkdir -p "$bin"
# Several trees may build at once (make test-kubernetes in each): one builds,
# the others wait and then find the binaries there.
exec 9>"$root/$key/lock"
flock 9

export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
# A build cache of its own, removed once every binary is built: the
# control plane's compiled packages serve no other build, and
# root's own cache stays small enough to copy (test-rootless.sh seeds the
# user's from it). An interrupted build keeps it, to resume.
export GOCACHE=$root/$key/go-build
scratch=$(mktemp -d "${TMPDIR:-/tmp}/safe-run-control-plane.XXXXXX")
trap 'chmod -R u+w "$scratch" 2>/dev/null || true; rm -rf "$scratch"' EXIT

# quiet CMD...: run CMD in the current directory, its output shown only if it fails.
quiet() {
	local out
	if ! out=$("$@" 2>&1); then
		echo "$out" >&2
		log "failed: $*"
		return 1
	fi
}

# build MODULE NAME VERSION PACKAGE [go build flags...]: build PACKAGE into
# $bin/NAME from the scratch module MODULE, which requires what PACKAGE needs.
build() {
	local dir=$scratch/$1 name=$2 version=$3 pkg=$4
	shift 4
	local start=$SECONDS
	log "building $name $version ($pkg)"
	(cd "$dir" && go build -trimpath "$@" -o "$bin/$name.partial" "$pkg")
	mv "$bin/$name.partial" "$bin/$name"
	log "built $name $version in $((SECONDS - start)) s: $bin/$name"
}

# scratch NAME: an empty module in $scratch/NAME.
scratch() {
	mkdir -p "$scratch/$1"
	(cd "$scratch/$1" && go mod init "safe-run.invalid/$1" >/dev/null 2>&1)
}

total=$SECONDS

if [ -x "$bin/etcd" ]; then log "etcd $ETCD_VERSION already built"; else
	scratch etcd
	(cd "$scratch/etcd" && quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
	build etcd etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
fi

if [ -x "$bin/kwok" ]; then log "kwok $KWOK_VERSION already built"; else
	scratch kwok
	(cd "$scratch/kwok" && quiet go get "sigs.k8s.io/kwok@$KWOK_VERSION")
	build kwok kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok -ldflags "-s -w"
fi
stages=$root/$key/kwok-stages
if [ -f "$stages/pod-ready.yaml" ]; then log "kwok $KWOK_VERSION stages already copied"; else
	scratch kwok-stages
	src=$(cd "$scratch/kwok-stages" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	mkdir -p "$stages.partial"
	cp "$src"/kustomize/stage/node/fast/node-initialize.yaml "$src"/kustomize/stage/node/heartbeat/node-heartbeat.yaml \
		"$src"/kustomize/stage/pod/fast/pod-*.yaml "$stages.partial/"
	chmod -R u+w "$stages.partial"
	rm -rf "$stages"
	mv "$stages.partial" "$stages"
	log "copied kwok $KWOK_VERSION stages to $stages"
fi

if [ -x "$bin/agent-sandbox-controller" ]; then log "agent-sandbox-controller $AGENT_SANDBOX_VERSION already built"; else
	scratch agent-sandbox
	(cd "$scratch/agent-sandbox" && quiet go get "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION")
	build agent-sandbox agent-sandbox-controller "$AGENT_SANDBOX_VERSION" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller -ldflags "-s -w"
fi

kube_missing=
for b in kube-apiserver kube-scheduler kube-controller-manager; do
	[ -x "$bin/$b" ] || kube_missing="$kube_missing $b"
done
if [ -z "$kube_missing" ]; then log "kubernetes $KUBERNETES_VERSION already built"; else
	scratch kubernetes
	dir=$scratch/kubernetes
	gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	[ -f "$gomod" ] || { log "cannot find the go.mod of k8s.io/kubernetes@$KUBERNETES_VERSION"; exit 1; }
	staging=v0.${KUBERNETES_VERSION#v1.}
	mods=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$gomod" | sort -u)
	[ -n "$mods" ] || { log "no v0.0.0 staging requires in $gomod"; exit 1; }
	log "replacing $(echo "$mods" | wc -l) staging modules of kubernetes $KUBERNETES_VERSION with their $staging releases"
	for m in $mods; do
		(cd "$dir" && go mod edit -replace "$m=$m@$staging")
	done
	(cd "$dir" && quiet go get "k8s.io/kubernetes@$KUBERNETES_VERSION")
	minor=${KUBERNETES_VERSION#v1.}
	minor=${minor%%.*}
	# One go build for the three: where one build ends on a link or on its
	# own last packages with a CPU idle, the next one's work fills it.
	pkgs=()
	for b in $kube_missing; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
	start=$SECONDS
	log "building$kube_missing $KUBERNETES_VERSION in one go build"
	rm -rf "$bin/kube.partial"
	mkdir "$bin/kube.partial"
	(cd "$dir" && go build -trimpath -o "$bin/kube.partial/" \
		-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
		"${pkgs[@]}")
	for b in $kube_missing; do mv "$bin/kube.partial/$b" "$bin/$b"; done
	rmdir "$bin/kube.partial"
	log "built$kube_missing $KUBERNETES_VERSION in $((SECONDS - start)) s"
fi

rm -rf "$GOCACHE"
log "control plane ready in $bin ($((SECONDS - total)) s)"
