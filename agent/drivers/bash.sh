# The persistent shell of a safe-run session. The agent starts it once and
# sends it cells; the working directory, variables and functions live on.
#
# Protocol: on fd 3 the agent writes, per cell, the code, a NUL, the cell's
# standard input, a NUL. After the cell, this driver writes the end marker
# ($SAFE_RUN_MARKER) to stdout and stderr, then "exit N" to fd 4.
__safe_run_marker=$SAFE_RUN_MARKER
unset SAFE_RUN_MARKER
__safe_run_stdin=$(mktemp /tmp/.safe-run-stdin.XXXXXX)
while IFS= read -r -d '' __safe_run_code <&3 && IFS= read -r -d '' __safe_run_input <&3; do
	printf '%s' "$__safe_run_input" >"$__safe_run_stdin"
	# The cell sees neither control pipe.
	eval "$__safe_run_code" <"$__safe_run_stdin" 3<&- 4>&-
	__safe_run_status=$?
	printf '%s' "$__safe_run_marker"
	printf '%s' "$__safe_run_marker" >&2
	printf 'exit %d\n' "$__safe_run_status" >&4
done
