#!/usr/bin/env bash
# build-runsc.sh OUT — build gVisor's runsc at the version pinned in scripts/runsc/go.mod.
#
# The pin lives in a module of its own so that gVisor's dependencies never
# constrain safe-run's. runsc is built static (CGO_ENABLED=0) from the Go
# module proxy; the first build takes a few minutes.
set -euo pipefail
out=${1:?usage: build-runsc.sh OUT}
case $out in /*) ;; *) out=$PWD/$out ;; esac
cd "$(dirname "${BASH_SOURCE[0]}")/runsc"
version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
echo "[runsc] building gvisor.dev/gvisor/runsc@$version (a few minutes on first build)" >&2
CGO_ENABLED=0 go build -trimpath \
	-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$version" \
	-o "$out.partial" gvisor.dev/gvisor/runsc
mv "$out.partial" "$out"
echo "[runsc] $("$out" --version | head -1)" >&2
