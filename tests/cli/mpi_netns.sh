# tests/cli/mpi_netns.sh: pipeline parallel across "nodes" over a real
# network stack: two network namespaces made here, joined by a veth pair
# with link-local addresses (169.254.77.1 and .2), stand for two nodes;
# mpirun runs in the first and starts its daemon in the second through a
# launcher that runs `ip netns exec NS` (plm_rsh_agent); MPI's messages go
# over TCP on the veth link only (btl tcp,self: no shared memory between
# the ranks). On stories260K tp2 x pp2 (ranks 0-1, stage 0, in one
# namespace; ranks 2-3, stage 1, in the other):
# - greedy ids equal the single process;
# - rank 2 (the other node) SIGKILLed in the middle of a batch: under plain
#   mpirun the job ends with a message naming it; under mpirun
#   --enable-recovery ranks 0, 1 and 3 name it (the watchdog's heartbeats
#   cross the link too) and exit 1.
# Skipped, with the reason, where `ip netns` is missing or not permitted
# (it needs root, or CAP_NET_ADMIN and CAP_SYS_ADMIN). The namespaces are
# removed at the end, whatever happened. Every bound is a safety bound for
# a loaded machine, never a measured time.
. tests/lib/tap.sh
T=$TMPD
need_mpirun "pipeline parallel across network namespaces"
if ! have_stories; then
	skip "pipeline parallel across network namespaces" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
if ! command -v ip >/dev/null 2>&1; then
	skip "pipeline parallel across network namespaces" "no ip command (apt-get install iproute2)"
	tap_done
fi
NA=llmt-$$-a NB=llmt-$$-b IF=llv$$
cleanup() {
	local ns
	for ns in $NA $NB; do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
		ip netns del "$ns" 2>/dev/null
	done
}
trap cleanup EXIT
if ! ip netns add $NA 2>"$T/ns.err" || ! ip netns add $NB 2>>"$T/ns.err"; then
	skip "pipeline parallel across network namespaces" "ip netns add: $(head -1 "$T/ns.err") (needs root or CAP_NET_ADMIN)"
	tap_done
fi
A=169.254.77.1 B=169.254.77.2
if ! { ip link add $IF netns $NA type veth peer name $IF netns $NB &&
       ip -n $NA addr add $A/24 dev $IF && ip -n $NB addr add $B/24 dev $IF &&
       ip -n $NA link set lo up && ip -n $NB link set lo up &&
       ip -n $NA link set $IF up && ip -n $NB link set $IF up; } 2>"$T/ns.err"; then
	skip "pipeline parallel across network namespaces" "a veth pair between namespaces: $(head -1 "$T/ns.err")"
	tap_done
fi
# the launcher: mpirun calls it as AGENT HOST COMMAND...; the command runs
# in HOST's namespace, as ssh would run it on HOST
cat >"$T/agent" <<EOF
#!/bin/sh
case \$1 in
$A) ns=$NA ;;
$B) ns=$NB ;;
*) echo "agent: unknown host \$1" >&2; exit 1 ;;
esac
shift
exec ip netns exec \$ns sh -c "\$*"
EOF
chmod +x "$T/agent"
printf '%s slots=2\n' $A $B >"$T/hosts"
if grep -q avx2 /proc/cpuinfo 2>/dev/null; then export LLM_CPU_ISA=avx2; else export LLM_CPU_ISA=scalar; fi
export T
NET="--mca btl_tcp_if_include 169.254.77.0/24 --mca oob_tcp_if_include 169.254.77.0/24"
# nsrun ARGS...: mpirun -np 4 over the two namespaces (ranks 0-1 in A, 2-3 in B)
nsrun() {
	timeout -k 10 300 ip netns exec $NA $MPIRUN --hostfile "$T/hosts" --mca plm_rsh_agent "$T/agent" \
		--mca btl tcp,self $NET -x PATH -x T -x LLM_CPU_ISA "$@"
}
# each rank's network namespace and exit status
WRAP='readlink /proc/self/ns/net >"$T/ns.$OMPI_COMM_WORLD_RANK"; "$0" "$@"; echo $? >"$T/rc.$OMPI_COMM_WORLD_RANK"'

S=$(stories)
llm-repartition -q "$S" "$T/s22" --tp 2 --pp 2
printf '%s\n' '{"prompt":"Once upon a time","max_tokens":16}' '{"prompt":"The cat sat","max_tokens":16}' \
	'{"prompt":"Lily and Tom went to the park","max_tokens":16}' >"$T/prompts"
gen1() { llm-generate -t 1 --kv-dtype f32 --json --temp 0 "$@"; }
gen1 -m "$S" <"$T/prompts" >"$T/ref.json"
nsrun -np 4 sh -c "$WRAP" llm-generate -t 1 --kv-dtype f32 --json --temp 0 -m "$T/s22" <"$T/prompts" >"$T/out.json" 2>"$T/err"; rc=$?
if grep -q "built without MPI" "$T/err"; then
	skip "pipeline parallel across network namespaces" "this build has no MPI (no mpicc when it was built)"
	tap_done
fi
two_nodes() {
	[ "$(cat "$T/ns.0")" = "$(cat "$T/ns.1")" ] && [ "$(cat "$T/ns.2")" = "$(cat "$T/ns.3")" ] &&
		[ "$(cat "$T/ns.0")" != "$(cat "$T/ns.2")" ] && [ "$(cat "$T/ns.0")" != "$(readlink /proc/self/ns/net)" ]
}
check "tp2 x pp2 over two namespaces: ranks 0-1 in one, 2-3 in the other ($(cat "$T"/ns.? 2>/dev/null | tr '\n' ' '))" two_nodes
if [ $rc = 0 ] && python3 -c "
import json, sys
a = [json.loads(l)['ids'] for l in open('$T/ref.json')]
b = [json.loads(l)['ids'] for l in open('$T/out.json')]
sys.exit(not (a == b and len(a) == 3))"; then
	ok "tp2 x pp2 over TCP between the namespaces: greedy ids equal the single process (3 prompts x 16 tokens)"
else
	notok "tp2 x pp2 over TCP between the namespaces: exit $rc"; grep -v PMIX "$T/err" | sed 's/^/#   /' | head -8
fi

# rank 2 killed in the middle of a batch
for i in $(seq 300); do echo '{"prompt":"Once upon a time","max_tokens":24}'; done >"$T/many"
rank_pid() {
	local p
	for p in $(pgrep -f "^llm-generate -t 1 -m $T/s22"); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return 0; }
	done
	return 1
}
# lose MPIRUN_ARGS...: run the batch, kill rank 2 after the first answer;
# K (kill status), RC, SECS (after the kill), N (answers)
lose() {
	rm -f "$T"/rc.* "$T/out.json"
	nsrun "$@" -np 4 sh -c "$WRAP" llm-generate -t 1 -m "$T/s22" --json --temp 0 <"$T/many" >"$T/out.json" 2>"$T/err" &
	local job=$! t0 p
	wait_until 180 sh -c "[ \$(wc -l <'$T/out.json') -ge 1 ]"
	p=$(rank_pid 2) && kill -KILL "$p"; K=$?
	t0=$SECONDS
	# the ranks' statuses (ranks 0, 1, 3), else the job's end, bounded
	while kill -0 $job 2>/dev/null && [ $((SECONDS - t0)) -lt 120 ] &&
	      ! [ -f "$T/rc.0" -a -f "$T/rc.1" -a -f "$T/rc.3" ]; do sleep 0.2; done
	SECS=$((SECONDS - t0))
	sleep 1
	MPIRUN_LEFT=0
	if kill -0 $job 2>/dev/null && ! wait_until 30 sh -c "! kill -0 $job 2>/dev/null"; then
		MPIRUN_LEFT=1       # its ranks have ended: mpirun itself is ended here
		pkill -KILL -P $job
		kill -KILL $job
	fi
	wait $job; RC=$?
	N=$(wc -l <"$T/out.json")
}
lose
if [ $K = 0 ] && [ $RC != 0 ] && [ $RC != 124 ] && [ $SECS -lt 120 ] && [ "$N" -lt 300 ] &&
   grep -qE "process rank 2 |lost rank 2" "$T/err"; then
	ok "plain mpirun: rank 2 (the other namespace) killed after $N answers ends the job (exit $RC, ${SECS}s): $(grep -hoE 'process rank 2 [^.]*|lost rank 2.*' "$T/err" | head -1)"
else
	notok "plain mpirun, rank 2 killed: kill $K, exit $RC after ${SECS}s, $N answers"; grep -v PMIX "$T/err" | sed 's/^/#   /' | head -8
fi
lose --enable-recovery
named=0
for r in 0 1 3; do
	[ "$(cat "$T/rc.$r" 2>/dev/null)" = 1 ] && grep -q "rank $r of 4: lost rank 2: no heartbeat" "$T/err" && named=$((named + 1))
done
if [ $K = 0 ] && [ $SECS -lt 120 ] && [ "$N" -lt 300 ] && [ $named = 3 ]; then
	ok "mpirun --enable-recovery: rank 2 killed after $N answers; ranks 0, 1 and 3 named it (heartbeats over the link) and exited 1 (${SECS}s)"
else
	notok "mpirun --enable-recovery, rank 2 killed: kill $K, ${SECS}s, $N answers, $named of 3 ranks named it"
	grep -v PMIX "$T/err" | sed 's/^/#   /' | head -8
fi
[ "$MPIRUN_LEFT" = 1 ] && [ $named = 3 ] && diag "mpirun --enable-recovery stayed up after its ranks had ended (Open MPI 4.1 across nodes); ended by the test"
tap_done
