#!/usr/bin/env bash
# mcp-clients.sh — check safe-run's MCP server with real, independent MCP
# clients rather than our own Go tests:
#
#   1. MCP Inspector CLI over stdio: tools/list --strict (no schema findings)
#   2. MCP Inspector CLI over stdio: tools/call run_code print(6*7) -> 42
#   3. the same two over Streamable HTTP (serve --http 127.0.0.1:0)
#   4. the official conformance suite against that HTTP server, judged
#      against the reviewed baseline .ci/conformance-baseline.yml
#
# Usage: scripts/mcp-clients.sh BIN      (BIN: the safe-run binary)
#
# The npm tools are pinned and installed once into
# ${SAFE_RUN_NPM_CACHE:-/var/cache/safe-run/npm-tools}, outside the repo; a
# re-run finds them there and installs nothing. Needs Node 20+ and npm.
# Prints a PASS or FAIL line per check and exits non-zero if any failed.
set -euo pipefail

INSPECTOR_VERSION=2.12.0   # v2; inspector v1 (1.0.3) is deprecated
CONFORMANCE_VERSION=0.1.13 # the newest that runs on Node 20
PACKAGES=("@modelcontextprotocol/inspector@$INSPECTOR_VERSION" "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION")

# Every step is bounded, so that a hang fails the run instead of blocking CI.
INSTALL_TIMEOUT=300 # npm install, first run only
CLIENT_TIMEOUT=60   # one inspector call, including a stdio server's start-up
SERVER_START_TIMEOUT=60
SERVER_STOP_TIMEOUT=45 # the server drains runs for up to 30 s, then shuts down HTTP
SUITE_TIMEOUT=300

if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
	echo "usage: $0 BIN   (BIN: path of the safe-run binary, e.g. \$PWD/bin/safe-run)" >&2
	exit 2
fi
BIN=$(realpath -- "$1") # absolute: the checks run from a scratch directory
if [[ ! -x $BIN ]]; then
	echo "mcp-clients: $1 is not an executable file" >&2
	exit 2
fi
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASELINE=$REPO/.ci/conformance-baseline.yml
TOOLS=${SAFE_RUN_NPM_CACHE:-/var/cache/safe-run/npm-tools}
for cmd in node npm timeout flock; do
	command -v "$cmd" >/dev/null || { echo "mcp-clients: $cmd is missing (Node 20+ and npm are needed)" >&2; exit 2; }
done
if (($(node -p 'process.versions.node.split(".")[0]') < 20)); then
	echo "mcp-clients: Node $(node --version) is too old; these tools need Node 20 or newer" >&2
	exit 2
fi

START=$SECONDS
WORK=$(mktemp -d -t safe-run-mcp-clients.XXXXXX)
SERVER_PID=
cleanup() {
	stop_server || true
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # still runs the EXIT trap, which stops the server
cd "$WORK"                # so nothing a tool writes lands in the repo

failures=()
pass() { echo "PASS: $1 ($2 s)"; }
fail() {
	echo "FAIL: $1 ($2 s)${3:+: $3}"
	failures+=("$1")
}

# quote ARGS...: the command line as one would type it.
quote() {
	local a out=()
	for a; do
		if [[ $a =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$a"); else out+=("${a@Q}"); fi
	done
	echo "${out[*]}"
}

# run NAME CMD...: print CMD, then run it bounded by CLIENT_TIMEOUT (or
# $LIMIT) with stdout in $WORK/NAME.out and stderr in $WORK/NAME.err. Sets RC
# to its exit code (124: timed out) and T0 to its start.
run() {
	local name=$1
	shift
	echo
	echo "\$ $(quote "$@")"
	T0=$SECONDS
	RC=0
	timeout -k 10 "${LIMIT:-$CLIENT_TIMEOUT}" "$@" </dev/null >"$WORK/$name.out" 2>"$WORK/$name.err" || RC=$?
}

# show NAME: the end of a failed step's output, to see why without re-running.
show() {
	echo "--- exit code $RC; end of stdout:"
	tail -n 20 "$WORK/$1.out" || true
	echo "--- end of stderr:"
	tail -n 20 "$WORK/$1.err" || true
	echo "---"
}

# json_check FILE JS: evaluate JS with `r` bound to the JSON in FILE; prints
# nothing and succeeds if JS returns "", else prints what it returned.
json_check() {
	node -e '
		const fs = require("fs");
		let r;
		try { r = JSON.parse(fs.readFileSync(process.argv[1], "utf8")); }
		catch (e) { console.log("output is not JSON: " + e.message); process.exit(1); }
		const why = (new Function("r", process.argv[2]))(r);
		if (why) { console.log(why); process.exit(1); }
	' "$1" "$2"
}

# What the two inspector checks expect, for both transports. --format json
# makes the CLI print one envelope {result, schemaFindings?}; with --strict,
# schemaFindings lists every schema portability finding, warnings included,
# and any error-severity one also makes the CLI exit 6.
EXPECT_TOOLS_LIST='
	const tools = (r.result && r.result.tools || []).map(t => t.name);
	if (r.schemaFindings && r.schemaFindings.length)
		return "schema findings: " + JSON.stringify(r.schemaFindings);
	if (!tools.includes("run_code")) return "run_code is not listed (tools: " + tools.join(", ") + ")";
	return "";'
EXPECT_CALL_42='
	const res = r.result || {};
	const text = (res.content || []).filter(c => c.type === "text").map(c => c.text).join("\n");
	if (res.isError) return "isError is set: " + text;
	if (!(res.structuredContent && res.structuredContent.stdout === "42\n")) return "stdout is not 42: " + JSON.stringify(res);
	if (!/\b42\b/.test(text)) return "the text content lacks 42: " + text;
	return "";'

# inspector_checks LABEL TARGET...: checks 1 and 2 against one transport.
inspector_checks() {
	local label=$1 why
	shift
	run "$label-tools-list" "$INSPECTOR" --cli "$@" --method tools/list --strict --format json
	if ((RC == 0)) && why=$(json_check "$WORK/$label-tools-list.out" "$EXPECT_TOOLS_LIST"); then
		pass "inspector $label tools/list --strict lists run_code, no schema findings" $((SECONDS - T0))
	else
		fail "inspector $label tools/list --strict" $((SECONDS - T0)) "${why:-exit code $RC}"
		show "$label-tools-list"
	fi
	why=
	run "$label-tools-call" "$INSPECTOR" --cli "$@" --method tools/call --tool-name run_code \
		--tool-arg language=python 'code=print(6*7)' --format json
	if ((RC == 0)) && why=$(json_check "$WORK/$label-tools-call.out" "$EXPECT_CALL_42"); then
		pass "inspector $label tools/call run_code print(6*7) returns 42" $((SECONDS - T0))
	else
		fail "inspector $label tools/call run_code" $((SECONDS - T0)) "${why:-exit code $RC}"
		show "$label-tools-call"
	fi
}

# stop_server: SIGTERM the HTTP server and wait, bounded, for it to exit;
# SIGKILL if it does not. Succeeds if it exited 0 in time, else says why in
# STOP_ERR. (Not in a subshell: only this shell can reap its child.)
stop_server() {
	STOP_ERR=
	[[ -n $SERVER_PID ]] || return 0
	local pid=$SERVER_PID rc=0 deadline=$((SECONDS + SERVER_STOP_TIMEOUT))
	SERVER_PID=
	kill -TERM "$pid" 2>/dev/null || true
	while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		STOP_ERR="did not exit within ${SERVER_STOP_TIMEOUT} s of SIGTERM; killed"
		return 1
	fi
	wait "$pid" 2>/dev/null || rc=$?
	((rc == 0)) || STOP_ERR="exited with code $rc after SIGTERM"
	return "$rc"
}

echo "== mcp-clients: $BIN ($(timeout 10 "$BIN" version 2>/dev/null | head -n1 || true)), node $(node --version), npm $(npm --version)"

# --- the pinned npm tools ----------------------------------------------------
# A stamp written only after a successful install records what is there, so
# an interrupted install is redone and a version bump here installs anew. The
# lock keeps two concurrent runs from installing into the same folder at once.
mkdir -p "$TOOLS"
INSPECTOR=$TOOLS/node_modules/.bin/mcp-inspector
CONFORMANCE=$TOOLS/node_modules/.bin/conformance
STAMP=$TOOLS/.installed
# An ordinary user may use tools root installed without being able to write
# there: it then takes the lock for reading, which still waits for an install.
{ exec 9>>"$TOOLS/.lock"; } 2>/dev/null || exec 9<"$TOOLS/.lock"
{
	flock -w "$INSTALL_TIMEOUT" 9 || { echo "mcp-clients: $TOOLS is locked by another install" >&2; exit 1; }
	if [[ $(cat "$STAMP" 2>/dev/null) == "${PACKAGES[*]}" && -x $INSPECTOR && -x $CONFORMANCE ]]; then
		echo "== npm tools: already installed in $TOOLS (${PACKAGES[*]})"
	else
		rm -f "$STAMP"
		LIMIT=$INSTALL_TIMEOUT run npm-install npm install --prefix "$TOOLS" --no-audit --no-fund --save-exact "${PACKAGES[@]}"
		if ((RC != 0)); then
			fail "npm install ${PACKAGES[*]}" $((SECONDS - T0))
			show npm-install
			exit 1
		fi
		# npm warns (EBADENGINE) that inspector 2.x wants Node 22; its CLI runs on 20.
		echo "== npm tools: installed in $TOOLS in $((SECONDS - T0)) s"
		echo "${PACKAGES[*]}" >"$STAMP"
	fi
}
exec 9>&-
# The inspector keeps a catalog of servers, a client config, OAuth state and
# secrets, by default under ~/.mcp-inspector (and maybe the OS keyring). Keep
# it off them: no user's state is read or written, and every run starts the
# same. Only the catalog lives with the tools (it stays empty here: ad-hoc
# targets are not saved); the rest is thrown away with this run.
export MCP_CATALOG_PATH=$TOOLS/catalog.json
export MCP_STORAGE_DIR=$WORK/inspector
export MCP_CLIENT_CONFIG_PATH=$WORK/inspector/client.json
export MCP_INSPECTOR_SECRET_STORE=memory

# --- 1, 2: inspector over stdio ------------------------------------------------
# The inspector starts `BIN serve` itself and talks to it over its stdin/stdout.
# Like desktop clients, it gives the server only a few variables (HOME, PATH,
# USER, ...); safe-run's own settings set here are passed on with -e, as a
# client configuration's "env" would.
SERVER_ENV=()
for name in $(compgen -e); do
	case $name in SAFE_RUN_* | XDG_RUNTIME_DIR | XDG_CACHE_HOME) SERVER_ENV+=(-e "$name=${!name}") ;; esac
done
inspector_checks stdio "${SERVER_ENV[@]}" "$BIN" serve

# --- 3: inspector over Streamable HTTP -----------------------------------------
# Port 0: the kernel picks a free port; the server prints the URL once ready.
echo
echo "\$ $BIN serve --http 127.0.0.1:0 &"
T0=$SECONDS
"$BIN" serve --http 127.0.0.1:0 </dev/null >"$WORK/server.out" 2>"$WORK/server.log" &
SERVER_PID=$!
URL=
while ((SECONDS - T0 < SERVER_START_TIMEOUT)); do
	URL=$(sed -n 's|^safe-run: serving MCP at \(http://[^ ]*/mcp\)$|\1|p' "$WORK/server.log" | head -n1)
	if [[ -n $URL ]] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
		break # ready, or exited
	fi
	sleep 0.1
done
if [[ -z $URL ]]; then
	fail "HTTP server start" $((SECONDS - T0)) "no URL on its stderr within ${SERVER_START_TIMEOUT} s, or it exited"
	tail -n 20 "$WORK/server.log"
	stop_server || true
else
	pass "HTTP server start: $URL" $((SECONDS - T0))
	# --stored-auth-only: never start an interactive OAuth login, which would
	# wait for a browser (safe-run asks for none without --token).
	inspector_checks http "$URL" --transport http --stored-auth-only

	# --- 4: the conformance suite ----------------------------------------------
	# --suite all: every server scenario of this version, the two "pending"
	# ones included, so that none is skipped silently. Scenarios that need the
	# suite's fixture tools/resources/prompts (test_*, test://...) or a feature
	# safe-run does not offer are listed, with reasons, in the baseline. The
	# tool exits 1 on a failure not in the baseline and on a baseline entry
	# that passes (stale), so the baseline has to stay exact.
	LIMIT=$SUITE_TIMEOUT run conformance "$CONFORMANCE" server --url "$URL" --suite all \
		--expected-failures "$BASELINE" -o "$WORK/conformance-results"
	sed -n '/=== SUMMARY ===/,$p' "$WORK/conformance.out"
	# The tool only matches scenario names. Also make sure that each failure
	# it excused is the inapplicability the baseline states -- the fixture or
	# the method is missing -- and not, say, a crash in a fixture-less part.
	why=
	if ((RC == 0)) && ! why=$(node -e '
		const fs = require("fs"), path = require("path"), dir = process.argv[1];
		const missing = /MCP error -32601|MCP error -32602: tool .* not found|MCP error -32002|^Tool .* not found\. Available tools/;
		const bad = [];
		for (const d of fs.readdirSync(dir))
			for (const c of JSON.parse(fs.readFileSync(path.join(dir, d, "checks.json"), "utf8")))
				if ((c.status === "FAILURE" || c.status === "WARNING") && !missing.test(c.errorMessage || ""))
					bad.push(`${d}: ${c.id}: ${c.errorMessage || c.description}`);
		if (bad.length) { console.log("failed for another reason than a missing fixture or method:\n  " + bad.join("\n  ")); process.exit(1); }
	' "$WORK/conformance-results" 2>&1); then
		RC=1
	fi
	if ((RC == 0)); then
		pass "conformance $CONFORMANCE_VERSION: no unexpected failures, no stale baseline entries, every expected one for its stated reason" $((SECONDS - T0))
	elif [[ -n $why ]]; then
		echo "$why"
		fail "conformance $CONFORMANCE_VERSION: a baseline entry failed for another reason than its stated one" $((SECONDS - T0))
	else
		fail "conformance $CONFORMANCE_VERSION: unexpected failures or stale baseline entries" $((SECONDS - T0)) "exit code $RC"
		tail -n 20 "$WORK/conformance.err"
		# Why each failing check failed, from the per-scenario results.
		for f in "$WORK"/conformance-results/*/checks.json; do
			[[ -e $f ]] || continue
			node -e 'for (const c of JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")))
				if (c.status === "FAILURE" || c.status === "WARNING")
					console.log(`  ${c.status} ${c.id}: ${c.errorMessage || c.description}`)' "$f"
		done
	fi

	# The baseline excuses logging, completions, prompts and resource
	# subscriptions only because safe-run does not offer them. Should it ever
	# advertise one, a broken implementation would hide behind its baseline
	# entry: make sure the initialize result still advertises none of them.
	T0=$SECONDS
	echo
	echo "\$ POST initialize to $URL; check its capabilities"
	if why=$(timeout -k 5 "$CLIENT_TIMEOUT" node -e '
		(async () => {
			const res = await fetch(process.argv[1], {
				method: "POST",
				headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream" },
				body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: {
					protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "mcp-clients.sh", version: "1" } } }),
			});
			let body = await res.text();
			// A Streamable HTTP server may answer as JSON or as an SSE stream.
			if ((res.headers.get("content-type") || "").includes("text/event-stream"))
				body = body.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5)).join("");
			const caps = JSON.parse(body).result.capabilities;
			const offered = ["logging", "completions", "prompts"].filter(k => k in caps);
			if (caps.resources && caps.resources.subscribe) offered.push("resources.subscribe");
			if (!caps.tools) offered.push("(tools missing)");
			if (offered.length) console.log("now advertised: " + offered.join(", ") + " — review the baseline; capabilities: " + JSON.stringify(caps));
			else console.log(JSON.stringify(caps));
			process.exit(offered.length ? 1 : 0);
		})().catch(e => { console.log(String(e)); process.exit(1); });' "$URL" 2>&1); then
		pass "baseline premise: capabilities $why advertise no logging, completions, prompts or subscriptions" $((SECONDS - T0))
	else
		fail "baseline premise" $((SECONDS - T0)) "$why"
	fi

	# Stop the server and check that it exits cleanly on SIGTERM.
	T0=$SECONDS
	echo
	echo "\$ kill -TERM <server>; wait"
	if stop_server; then
		pass "HTTP server exits 0 on SIGTERM" $((SECONDS - T0))
	else
		fail "HTTP server stop" $((SECONDS - T0)) "$STOP_ERR"
		tail -n 20 "$WORK/server.log"
	fi
fi

echo
if ((${#failures[@]})); then
	echo "mcp-clients: ${#failures[@]} check(s) FAILED in $((SECONDS - START)) s:"
	printf '  - %s\n' "${failures[@]}"
	exit 1
fi
echo "mcp-clients: all checks passed in $((SECONDS - START)) s"
