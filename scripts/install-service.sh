#!/usr/bin/env bash
# install-service.sh — install or remove safe-run as a systemd service
# (deploy/systemd/safe-run.service), as `make install-service` and
# `make uninstall-service` run it, as root, after `make build runsc`:
#
#   scripts/install-service.sh install      binaries, user, unit, config, token, TLS, image; enable + start
#   scripts/install-service.sh uninstall    all of it, except the audit log (PURGE=1 removes it too)
#
# Settings (environment): PREFIX (/usr/local), SERVICE_ADDR (the listener,
# 127.0.0.1:8443), SERVICE_TLS_NAMES (names and addresses the generated
# certificate is for: localhost 127.0.0.1 and this host's name), PURGE.
# What exists already is kept: the config, the token, the certificate.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PREFIX=${PREFIX:-/usr/local}
ADDR=${SERVICE_ADDR:-127.0.0.1:8443}
USER_NAME=safe-run
UNIT=/etc/systemd/system/safe-run.service
ETC=/etc/safe-run
BIN=$PREFIX/bin

say() { echo "install-service: $*"; }
[[ $(id -u) == 0 ]] || { echo "install-service: run as root (sudo make install-service)" >&2; exit 1; }
command -v systemctl >/dev/null || { echo "install-service: systemctl not found; this installs a systemd service" >&2; exit 1; }

install_service() {
	for f in bin/safe-run bin/safe-run-agent bin/safe-run-net bin/safe-run-shim bin/runsc; do
		[[ -x $f ]] || { echo "install-service: $f is missing; run make build runsc first" >&2; exit 1; }
	done
	say "binaries into $BIN"
	install -d "$BIN"
	install -m 755 bin/safe-run bin/safe-run-agent bin/safe-run-net bin/safe-run-shim bin/runsc "$BIN/"
	if ! id -u "$USER_NAME" >/dev/null 2>&1; then
		say "system user $USER_NAME"
		useradd --system --user-group --home-dir /var/lib/safe-run --no-create-home --shell /usr/sbin/nologin \
			--comment "safe-run MCP server" "$USER_NAME"
	fi
	install -d -m 750 -o root -g "$USER_NAME" "$ETC" "$ETC/tls"
	if [[ ! -e $ETC/config.json ]]; then
		say "$ETC/config.json (listening on $ADDR)"
		cat >"$ETC/config.json" <<JSON
{
  "http": "$ADDR",
  "tls-cert": "$ETC/tls/cert.pem",
  "tls-key": "$ETC/tls/key.pem",
  "token-file": "$ETC/token",
  "state-dir": "/run/safe-run",
  "audit-log": "/var/log/safe-run/audit.jsonl"
}
JSON
		chmod 640 "$ETC/config.json"
		chgrp "$USER_NAME" "$ETC/config.json"
	fi
	if [[ ! -e $ETC/token ]]; then
		say "$ETC/token (a new bearer token, readable by $USER_NAME only)"
		(umask 077 && head -c 32 /dev/urandom | base64 | tr -d '=+/\n' >"$ETC/token")
	fi
	chown "$USER_NAME:$USER_NAME" "$ETC/token"
	chmod 600 "$ETC/token"
	if [[ ! -e $ETC/tls/cert.pem ]]; then
		tls_cert
	fi
	say "the default image in the system cache $(bin/safe-run image dir) (read-only for the service)"
	bin/safe-run image build default
	say "unit $UNIT"
	sed "s|/usr/local/bin/safe-run|$BIN/safe-run|" deploy/systemd/safe-run.service >"$UNIT"
	chmod 644 "$UNIT"
	systemctl daemon-reload
	systemctl enable safe-run.service
	systemctl restart safe-run.service
	local url="https://$ADDR/mcp" i
	for ((i = 0; i < 900; i++)); do
		journalctl -u safe-run.service -b --no-pager -q 2>/dev/null | grep -q "serving MCP at" && break
		systemctl is-failed -q safe-run.service && break
		# A server that exits at start is restarted by the unit forever:
		# after a few tries, say why instead of waiting.
		if (($(systemctl show -p NRestarts --value safe-run.service) >= 3)); then
			journalctl -u safe-run.service -b --no-pager -q | grep -v "^-- " | tail -n 8 >&2
			echo "install-service: the service keeps exiting at start (above); fix it and run make install-service again" >&2
			exit 1
		fi
		sleep 1
	done
	systemctl --no-pager --lines=5 status safe-run.service || {
		echo "install-service: the service did not start; see journalctl -u safe-run" >&2
		exit 1
	}
	cat <<MSG

safe-run is running as user $USER_NAME: systemctl status safe-run; journalctl -u safe-run
MCP endpoint: $url
  bearer token: $ETC/token (sudo cat $ETC/token)
  TLS: trust $ETC/tls/ca.pem (Node: NODE_EXTRA_CA_CERTS=$ETC/tls/ca.pem)
Connect a client, e.g. the TypeScript SDK:
  NODE_EXTRA_CA_CERTS=$ETC/tls/ca.pem NODE_PATH=<dir>/node_modules node scripts/mcp-run.mjs $url "\$(sudo cat $ETC/token)" 'print(6*7)'
Or a client's config: {"url": "$url", "headers": {"Authorization": "Bearer <token>"}}
Audit log: /var/log/safe-run/audit.jsonl (safe-run audit verify /var/log/safe-run/audit.jsonl)
Check the unit: sudo $BIN/safe-run doctor --unit safe-run.service
MSG
}

# tls_cert makes a CA of this host's own and a server certificate it signs
# for SERVICE_TLS_NAMES; the CA's key is thrown away once it has signed.
tls_cert() {
	command -v openssl >/dev/null || { echo "install-service: openssl is needed to make the TLS certificate (apt-get install openssl), or put your own in $ETC/tls/cert.pem and key.pem" >&2; exit 1; }
	local names=${SERVICE_TLS_NAMES:-localhost 127.0.0.1 $(hostname)} san="" n tmp
	for n in $names; do
		if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="${san:+,}IP:$n"; else san+="${san:+,}DNS:$n"; fi
	done
	say "$ETC/tls: a CA of this host's own and a certificate for $san"
	tmp=$(mktemp -d)
	(
		umask 077
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
			-subj "/CN=safe-run CA on $(hostname)" -keyout "$tmp/ca.key" -out "$tmp/ca.pem" 2>/dev/null
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$(hostname)" \
			-keyout "$tmp/key.pem" -out "$tmp/csr.pem" 2>/dev/null
		printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$tmp/ext"
		openssl x509 -req -in "$tmp/csr.pem" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial -days 825 \
			-extfile "$tmp/ext" -out "$tmp/cert.pem" 2>/dev/null
	)
	install -m 644 "$tmp/ca.pem" "$ETC/tls/ca.pem"
	install -m 644 "$tmp/cert.pem" "$ETC/tls/cert.pem"
	install -m 600 -o "$USER_NAME" -g "$USER_NAME" "$tmp/key.pem" "$ETC/tls/key.pem"
	rm -rf "$tmp"
}

uninstall_service() {
	if [[ -e $UNIT ]]; then
		say "stopping and removing the unit"
		systemctl disable --now safe-run.service || true
		rm -f "$UNIT"
		systemctl daemon-reload
		systemctl reset-failed safe-run.service 2>/dev/null || true
	fi
	say "binaries from $BIN, $ETC, the service's cache, state and runtime directories"
	rm -f "$BIN/safe-run" "$BIN/safe-run-agent" "$BIN/safe-run-net" "$BIN/safe-run-shim" "$BIN/runsc"
	rm -rf "$ETC" /var/cache/safe-run-service /var/lib/safe-run /run/safe-run
	if [[ ${PURGE:-} == 1 ]]; then
		say "PURGE=1: the audit log /var/log/safe-run too"
		rm -rf /var/log/safe-run
	elif [[ -d /var/log/safe-run ]]; then
		say "kept the audit log in /var/log/safe-run (PURGE=1 removes it)"
	fi
	if id -u "$USER_NAME" >/dev/null 2>&1; then
		if [[ ${PURGE:-} == 1 || ! -d /var/log/safe-run ]]; then
			userdel "$USER_NAME" 2>/dev/null || true
			say "removed user $USER_NAME"
		else
			# The kept log stays owned by a user that exists, not by a number a later account may get.
			say "kept user $USER_NAME, which owns the kept audit log"
		fi
	fi
}

case ${1:-} in
install) install_service ;;
uninstall) uninstall_service ;;
*)
	echo "usage: $0 install|uninstall" >&2
	exit 2
	;;
esac
