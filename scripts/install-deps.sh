#!/usr/bin/env bash
# install-deps.sh — install the host packages safe-run's build needs on
# Debian or Ubuntu: debootstrap (the default image), pigz (faster archives),
# ca-certificates, and Node.js with npm (the MCP clients the tests use; Node
# 20 or newer). Installs only what is missing; needs root to install. For an
# ordinary user it names what is missing and goes on: mmdebstrap and uidmap
# build the image without root, and nothing is needed if the image is
# imported instead (see README, "Without root").
set -euo pipefail
need=()
if [[ $(id -u) == 0 ]]; then
	command -v debootstrap >/dev/null || need+=(debootstrap)
else
	command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
	command -v newuidmap >/dev/null || command -v fakechroot >/dev/null || need+=(uidmap)
fi
command -v pigz >/dev/null || need+=(pigz)
[[ -e /etc/ssl/certs/ca-certificates.crt ]] || need+=(ca-certificates)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
if ((${#need[@]})); then
	if [[ $(id -u) != 0 ]]; then
		echo "install-deps: missing ${need[*]} (building the image without root needs mmdebstrap and uidmap; make test needs nodejs and npm);" \
			"have them installed once: apt-get install -y ${need[*]}" >&2
	else
		echo "[deps] apt-get install ${need[*]}" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
fi
if ! command -v go >/dev/null; then
	echo "install-deps: Go is missing; install Go 1.21 or newer (it fetches the exact toolchain go.mod names by itself)" >&2
	exit 1
fi
