#!/usr/bin/env bash
# build-runsc.sh OUT — build gVisor's runsc at the version pinned in scripts/runsc/go.mod.
#
# The pin lives in a module of its own so that gVisor's dependencies never
# constrain safe-run's. runsc is built static (CGO_ENABLED=0) from the Go
# module proxy; the first build takes a few minutes.
#
# The Go branch of gVisor ships its seccomp filters as rules only: a plain
# `go build` runsc compiles them to BPF at every start and every restore
# (measured here: ~15 ms of CPU per `runsc run`, ~25-40 ms per restore).
# gVisor's own Bazel build embeds them precompiled; scripts/runsc/precompile
# generates the same programs from the pinned gVisor's rules, and the build
# uses them in place of the empty filter_precompiled.go files. The module
# cache is read-only and `go build -overlay` refuses to replace files in it,
# so the build runs against a copy of the gVisor module (a `replace` in a
# temporary go.mod). runsc logs "Loaded precompiled seccomp instructions"
# with --debug when it finds its program.
set -euo pipefail
out=${1:?usage: build-runsc.sh OUT}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/runsc"
version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
go mod download gvisor.dev/gvisor
src=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
[ -d "$src/runsc" ] || { echo "[runsc] cannot find gvisor.dev/gvisor@$version in the module cache" >&2; exit 1; }
# A fixed path beside OUT, not a fresh temporary one, so that Go's build
# cache still matches a rebuild of the copied module.
work=$out.build
cleanup() { chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"; }
cleanup
trap cleanup EXIT
mkdir -p "$work"

echo "[runsc] precompiling the seccomp programs of gvisor.dev/gvisor@$version" >&2
CGO_ENABLED=0 go run ./precompile "$work"
cp -R "$src" "$work/gvisor"
chmod -R u+w "$work/gvisor"
cp "$work/sentry_filter_precompiled.go" "$work/gvisor/runsc/boot/filter/filter_precompiled.go"
cp "$work/gofer_filter_precompiled.go" "$work/gvisor/runsc/fsgofer/filter/filter_precompiled.go"
cp go.mod "$work/go.mod"
cp go.sum "$work/go.sum"
echo "replace gvisor.dev/gvisor => $work/gvisor" >>"$work/go.mod"

echo "[runsc] building gvisor.dev/gvisor/runsc@$version (a few minutes on first build)" >&2
CGO_ENABLED=0 go build -modfile "$work/go.mod" -trimpath \
	-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$version" \
	-o "$out.partial" gvisor.dev/gvisor/runsc
mv "$out.partial" "$out"
echo "[runsc] $("$out" --version | head -1)" >&2
