# The warm Bash of a pooled safe-run sandbox. The agent starts the run's own
# command, `bash main.sh`, before the script is known, with this file as
# BASH_ENV: Bash sources it after its start-up and before it opens the
# script, so the start of the shell (the fork, the exec, loading it and its
# libraries, about 25 ms inside gVisor) is paid before the call, and the
# script then runs in the very shell a cold start would have made, not
# sourced by another one. The agent removes this file once the shell has
# read it (at "ready").
#
# Protocol (see warmProgram in agent/warm.go): it writes "ready" to fd 3,
# then reads messages on its stdin, each a line padded with spaces to 24
# bytes (see shellMessageSize) so that one read takes it whole and nothing
# after it: "prime 0" is answered "primed"; "run 0 SEED" says that the
# agent has written the script, and what follows it on stdin is the run's
# own input. It then closes fd 3 (the one descriptor beyond the stdio, as a
# cold shell has none; Bash's closing of each costs six system calls, and
# `read -u 3` or `<&3` more), removes every trace of itself a script could
# see — its variables, BASH_ENV, the start of SECONDS, the value of $_ —
# reseeds RANDOM with the agent's SEED, drawn from the kernel for the run (a
# shell started before a checkpoint would otherwise share its seed with
# every sandbox restored from it), and returns, and Bash runs the script.
# Anything else, or the end of stdin, exits: there is nothing to run.
#
# What stays visible: the shell's start time, its exec-time environment in
# /proc/$$/environ (BASH_ENV included), and, in a listing of all variables
# (declare -p, set), the values of RANDOM, SECONDS, BASH_ARGV, BASH_ARGC and
# PIPESTATUS, which a cold script lists too once it has used them or run a
# command.
#
# The agent appends the last line, `: VALUE`, which leaves in $_ what a
# cold shell starts with.
echo ready >&3
while read -r -N 24 __safe_run_msg; do
	__safe_run_cmd=${__safe_run_msg%% *}
	__safe_run_seed=${__safe_run_msg#* }
	__safe_run_seed=${__safe_run_seed#* }
	__safe_run_seed=${__safe_run_seed%% *}
	case $__safe_run_cmd in
	prime) echo primed >&3 ;;
	run) break ;;
	*) exit 0 ;;
	esac
done
[ "$__safe_run_cmd" = run ] || exit 0
exec 3>&-
RANDOM=$__safe_run_seed
unset -v __safe_run_msg __safe_run_cmd __safe_run_seed BASH_ENV
SECONDS=0
