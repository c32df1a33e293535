# tests/cli/mpi.sh: the communication layer (common/engine/comm.h) under a real
# launcher: mpirun -np 2 and 4 run $LLM_TESTBIN/mpi_check (build/cpu/tests or build/cuda/tests), whose rank 0
# prints one TAP line per check (failed if any rank failed it); a failing
# rank (llm_comm_die, exit, SIGKILL) must end the job naming it, never hang;
# a partitioned checkpoint opened by as many ranks as it was made for works,
# and by another number of ranks ends the job with a message.
# Ranks are oversubscribed (CI has 2 cores); root needs --allow-run-as-root.
. tests/lib/tap.sh
T=$TMPD
C=${LLM_TESTBIN:-build/cpu/tests}/mpi_check
if [ ! -x "$C" ]; then notok "mpi_check is built ($C)"; tap_done; fi

# one process, no launcher: the single-process implementation, same checks
"$C" collectives >"$T/single.out" 2>"$T/single.err"; rc=$?
cat "$T/single.out"
check "mpi_check without mpirun: one-rank world, exit 0" [ $rc = 0 ]

need_mpirun "mpirun -np 2 and 4: collectives, grid, failing ranks, partitions"
run() { local n=$1; shift; timeout 300 $MPIRUN -np "$n" "$C" "$@"; }

run 2 collectives >"$T/c2.out" 2>"$T/c2.err"; rc=$?
if grep -q "built without MPI" "$T/c2.err"; then
	skip "mpirun -np 2 and 4" "this build has no MPI (no mpicc when it was built)"
	tap_done
fi
grep -E '^(not )?ok' "$T/c2.out"
check "mpirun -np 2 mpi_check collectives: exit 0 and every check ran on the MPI layer" \
	sh -c "[ $rc = 0 ] && grep -q '(mpi) (2 ranks)' '$T/c2.out' && [ \$(grep -c '^ok' '$T/c2.out') -ge 10 ]"
[ $rc = 0 ] || sed 's/^/#   /' "$T/c2.err" | head -20

run 4 collectives >"$T/c4.out" 2>"$T/c4.err"; rc=$?
grep -E '^(not )?ok' "$T/c4.out"
check "mpirun -np 4 mpi_check collectives: exit 0" [ $rc = 0 ]

for g in "4 2 2" "2 2 1" "2 1 2"; do
	set -- $g
	run "$1" grid "$2" "$3" >"$T/g.out" 2>"$T/g.err"; rc=$?
	grep -E '^(not )?ok' "$T/g.out"
	check "mpirun -np $1 grid tp $2 x pp $3: exit 0" [ $rc = 0 ]
done

# a failing rank takes the job down, naming itself, within the timeout
for how in die exit kill; do
	start=$SECONDS
	run 2 "$how" >"$T/f.out" 2>"$T/f.err"; rc=$?
	took=$((SECONDS - start))
	if [ $rc != 0 ] && [ $rc != 124 ] && grep -qE 'rank 1( |$)|rank 1 of 2' "$T/f.err" && ! grep -q '^not ok' "$T/f.out"; then
		ok "rank 1 failing by $how ends the job (exit $rc, ${took}s) with a message naming rank 1"
	else
		notok "rank 1 failing by $how: exit $rc after ${took}s"; sed 's/^/#   /' "$T/f.err" | head -10
	fi
done
grep -h "rank 1" "$T/f.err" | head -2 | sed 's/^/# /'

# partitioned checkpoints: each rank maps its own file; a mismatch is refused
if have_stories; then
	llm-repartition -q "$(stories)" "$T/p22" --tp 2 --pp 2
	run 4 partition "$T/p22" >"$T/p.out" 2>"$T/p.err"; rc=$?
	grep -E '^(not )?ok' "$T/p.out"
	check "mpirun -np 4 on a tp2 x pp2 checkpoint: each rank opens its own file" [ $rc = 0 ]
	run 2 partition "$T/p22" >"$T/p.out" 2>"$T/p.err"; rc=$?
	if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "partitioned for --tp 2 x --pp 2 = 4 ranks, but 2 were launched" "$T/p.err"; then
		ok "mpirun -np 2 on a tp2 x pp2 checkpoint is refused, naming both counts"
	else
		notok "mpirun -np 2 on a tp2 x pp2 checkpoint: exit $rc"; sed 's/^/#   /' "$T/p.err" | head -5
	fi
else
	skip "partitioned checkpoint under mpirun" "no stories260K in \$LLM_TEST_MODELS"
fi
tap_done
