# tests/cli/mpi_lost.sh: a rank SIGKILLed in the middle of a batch (comm.h,
# "a lost rank"), on stories260K partitioned tp2 x pp2 (mpirun -np 4), ranks
# on this host:
# - llm-generate under plain mpirun: mpirun ends every other rank and exits
#   non-zero, its message naming the killed rank;
# - llm-generate under mpirun --enable-recovery (mpirun leaves the other
#   ranks running, and Open MPI 4 would leave them waiting forever): the
#   watchdog of each other rank names the lost rank and exits 1;
# - llm-serve under mpirun --enable-recovery: /health turns 503 "failed",
#   the clients in flight (plain and streamed, 4 choices each, all in the
#   running batch; two more sent after the kill) get a 503 error naming the lost rank, a new request
#   gets 503, and every rank ends with status 1; under plain mpirun,
#   mpirun ends the job and no client hangs (their connections close);
# - llm-finetune (-np 2, --save-every 1): rank 1 killed under plain mpirun,
#   then again under --enable-recovery after resuming: each time the state
#   rank 0 saved resumes, and the run ends with the adapter of the
#   uninterrupted run, bit for bit; and rank 1 killed while the ranks start
#   (rank 0 ends all the same).
# Every bound is a safety bound for a loaded machine (the job is killed
# past it and the check fails), never a measured time.
. tests/lib/tap.sh
T=$TMPD
need_mpirun "a lost rank under mpirun"
if ! have_stories; then
	skip "a lost rank under mpirun" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
S=$(stories)
export T
BOUND=120        # seconds a job may take to end after the kill
# per-rank exit status in $T/rc.R: mpirun --enable-recovery exits 0 whatever
# its ranks did (Open MPI 4.1)
WRAP='"$0" "$@"; echo $? >"$T/rc.$OMPI_COMM_WORLD_RANK"'
# the same, each rank's stderr in $T/err.R (mpirun stops forwarding output
# when a rank is lost under --enable-recovery)
WRAP_ERR='"$0" "$@" 2>>"$T/err.$OMPI_COMM_WORLD_RANK"; echo $? >"$T/rc.$OMPI_COMM_WORLD_RANK"'
mpijob() { timeout -k 10 300 $MPIRUN -x T -x LLM_CPU_ISA "$@"; }
if grep -q avx2 /proc/cpuinfo 2>/dev/null; then export LLM_CPU_ISA=avx2; else export LLM_CPU_ISA=scalar; fi

# rank_pid R PATTERN: the pid of world rank R among the processes whose
# command line matches PATTERN
rank_pid() {
	local p
	for p in $(pgrep -f "$2"); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return 0; }
	done
	return 1
}
# kill_rank R PATTERN: SIGKILL it (waits, bounded, for it to exist)
kill_rank() {
	local p
	wait_until 60 rank_pid "$1" "$2" >/dev/null || return 1
	p=$(rank_pid "$1" "$2") && kill -KILL "$p"
}
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
# ended PID: wait for the job (bounded: BOUND s after the kill, then killed); RC, SECS
ended() {
	local t0=$SECONDS
	while kill -0 "$1" 2>/dev/null && [ $((SECONDS - t0)) -lt $BOUND ]; do sleep 0.2; done
	kill -0 "$1" 2>/dev/null && { pkill -KILL -P "$1"; kill -KILL "$1"; }
	wait "$1"; RC=$?
	SECS=$((SECONDS - t0))
}
# others_named R N: every rank of N but R left status 1 and a line naming R
others_named() {
	local r
	for r in $(seq 0 $(($2 - 1))); do
		[ "$r" = "$1" ] && continue
		[ "$(cat "$T/rc.$r" 2>/dev/null)" = 1 ] || { echo "rank $r: status $(cat "$T/rc.$r" 2>/dev/null || echo none)"; return 1; }
		grep -q "rank $r of $2: lost rank $1: no heartbeat from it" "$T"/err* 2>/dev/null ||
			{ echo "rank $r: no line naming rank $1"; return 1; }
	done
}

llm-repartition -q "$S" "$T/s22" --tp 2 --pp 2
mpijob -np 2 llm-generate -m "$S" -p x -n 1 >/dev/null 2>"$T/err"
if grep -q "built without MPI" "$T/err"; then
	skip "a lost rank under mpirun" "this build has no MPI (no mpicc when it was built)"
	tap_done
fi
# a batch that takes many steps: rank 1 is killed once output has begun
for i in $(seq 400); do echo '{"prompt":"Once upon a time","max_tokens":64}'; done >"$T/prompts"

# gen MODE: llm-generate over the batch, rank 1 killed after the first answer
gen() {
	rm -f "$T"/rc.* "$T/out.json" "$T"/err*
	mpijob "$@" -np 4 sh -c "$WRAP" llm-generate -t 1 -m "$T/s22" --json --temp 0 <"$T/prompts" >"$T/out.json" 2>"$T/err" &
	local job=$!
	wait_until 120 sh -c "[ \$(wc -l <'$T/out.json') -ge 1 ]"
	kill_rank 1 "^llm-generate -t 1 -m $T/s22"; local k=$?
	ended $job
	N=$(lines "$T/out.json")
	return $k
}
gen; k=$?
if [ $k = 0 ] && [ $RC != 0 ] && [ $RC != 124 ] && [ "$N" -lt 400 ] && grep -qE "process rank 1 with PID|lost rank 1" "$T/err"; then
	ok "llm-generate, plain mpirun: rank 1 killed after $N of 400 answers; mpirun ended the job (exit $RC, ${SECS}s): $(grep -E 'process rank 1|lost rank 1' "$T/err" | head -1)"
else
	notok "llm-generate, plain mpirun: kill $k, exit $RC after ${SECS}s, $N answers"; sed 's/^/#   /' "$T/err" | head -8
fi
gen --enable-recovery; k=$?
if [ $k = 0 ] && [ $SECS -lt $BOUND ] && [ "$N" -lt 400 ] && why=$(others_named 1 4); then
	ok "llm-generate, mpirun --enable-recovery: rank 1 killed after $N answers; ranks 0, 2, 3 named it and exited 1 (${SECS}s): $(grep -m1 'lost rank 1' "$T/err")"
else
	notok "llm-generate, mpirun --enable-recovery: kill $k, ${SECS}s, $N answers: ${why:-}"; grep -v PMIX "$T/err" | sed 's/^/#   /' | head -8
fi

# llm-serve: clients in flight when rank 1 is killed
# running N: the server has N sequences running (the 5 requests of 4
# choices each are all in the batch, not waiting)
running() {
	[ "$(curl -s -m 5 "$URL/metrics" | awk '$1 == "llm_requests_running" {print $2}')" -ge "$1" ] 2>/dev/null
}
if command -v curl >/dev/null 2>&1; then
	rm -f "$T"/rc.* "$T"/err* "$T/port" "$T"/c*.out
	mpijob --enable-recovery -np 4 sh -c "$WRAP_ERR" llm-serve -m "$T/s22" --port 0 \
		--port-file "$T/port" -t 1 --max-running 32 2>"$T/err.mpirun" &
	SP=$!
	URL=$(serve_url "$T/port" 90)
	if curl -sf -m 5 "$URL/health" >/dev/null; then
		body='{"prompt":"Once upon a time","max_tokens":500,"temperature":0,"ignore_eos":true,"n":4'
		p1=$(rank_pid 1 "^llm-serve -m $T/s22")      # found now: killed at once below
		cpids=
		for i in 1 2 3 4; do
			curl -s -m 200 -o "$T/c$i.out" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body}" \
				"$URL/v1/completions" >"$T/c$i.code" &
			cpids="$cpids $!"
		done
		curl -sN -m 200 -H 'Content-Type: application/json' -d "$body,\"stream\":true}" "$URL/v1/completions" >"$T/c5.out" &
		cpids="$cpids $!"
		wait_until 60 running 20 && wait_until 60 grep -q '^data: {' "$T/c5.out"
		kill -KILL "$p1"; k=$?
		# and two more while the server has not yet found the loss
		for i in 6 7; do
			curl -s -m 200 -o "$T/c$i.out" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body}" \
				"$URL/v1/completions" >"$T/c$i.code" &
			cpids="$cpids $!"
		done
		health() { [ "$(curl -s -m 5 -o "$T/health" -w '%{http_code}' "$URL/health")" = 503 ]; }
		wait_until $BOUND health
		check "llm-serve: /health turns 503 {\"status\":\"failed\"} after rank 1 is killed (kill $k)" grep -q '"failed"' "$T/health"
		curl -s -m 30 -o "$T/new.out" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body}" \
			"$URL/v1/completions" >"$T/new.code"
		check "llm-serve: a new request gets 503 naming the lost rank ($(cat "$T/new.code"))" \
			sh -c "[ \"\$(cat '$T/new.code')\" = 503 ] && grep -q 'lost rank 1' '$T/new.out'"
		wait $cpids
		check "llm-serve: every client in flight got an answer, each 503 naming the lost rank ($(cat "$T"/c?.code | tr '\n' ' '))" \
			sh -c "for i in 1 2 3 4 6 7; do [ \"\$(cat $T/c\$i.code)\" = 503 ] && grep -q 'rank 0 of 4: lost rank 1' $T/c\$i.out || exit 1; done"
		check "llm-serve: the streamed client got an error event naming the lost rank, then [DONE]" \
			sh -c "grep -q '^data: {\"error\".*lost rank 1' '$T/c5.out' && tail -n 3 '$T/c5.out' | grep -q 'data: \[DONE\]'"
		ended $SP
		if [ $SECS -lt $BOUND ] && why=$(others_named 1 4); then
			ok "llm-serve: ranks 0, 2, 3 named the lost rank and exited 1 (the job ended ${SECS}s after the stream's answer)"
		else
			notok "llm-serve: the ranks' ends: ${why:-job still running after ${BOUND}s}"; cat "$T"/err.* | grep -v PMIX | sed 's/^/#   /' | head -8
		fi
	else
		notok "llm-serve under mpirun --enable-recovery: /health 200 within 90 s"; sed 's/^/#   /' "$T"/err.* | head -5
		kill -TERM $SP 2>/dev/null; wait $SP
	fi
	# plain mpirun: it ends every rank (rank 0 gets SIGTERM, then SIGKILL
	# a second later), so the clients in flight see their connection
	# closed; none may hang
	rm -f "$T"/rc.* "$T"/err* "$T/port" "$T"/c*.out "$T"/c*.code
	mpijob -np 4 sh -c "$WRAP_ERR" llm-serve -m "$T/s22" --port 0 --port-file "$T/port" -t 1 --max-running 32 2>"$T/err.mpirun" &
	SP=$!
	URL=$(serve_url "$T/port" 90)
	p1=$(rank_pid 1 "^llm-serve -m $T/s22")
	cpids=
	for i in 1 2 3 4; do
		{ curl -s -m 200 -o "$T/c$i.out" -H 'Content-Type: application/json' -d "$body}" "$URL/v1/completions"
		  echo $? >"$T/c$i.code"; } &
		cpids="$cpids $!"
	done
	curl -sN -m 200 -H 'Content-Type: application/json' -d "$body,\"stream\":true}" "$URL/v1/completions" >"$T/c5.out" &
	cpids="$cpids $!"
	wait_until 60 running 20 && wait_until 60 grep -q '^data: {' "$T/c5.out"
	kill -KILL "$p1"; k=$?
	ended $SP
	wait $cpids
	codes=$(cat "$T"/c?.code 2>/dev/null | tr '\n' ' ')
	if [ -n "$p1" ] && [ $k = 0 ] && [ $RC != 0 ] && [ $RC != 124 ] && grep -qE "process rank 1 with PID" "$T/err.mpirun" &&
	   [ "$(echo $codes | wc -w)" = 4 ] && ! echo " $codes" | grep -qE ' (0|28) '; then
		ok "llm-serve, plain mpirun: rank 1 killed, mpirun ended the job (exit $RC, ${SECS}s), naming it; no client hung (curl exits $codes)"
	else
		notok "llm-serve, plain mpirun: kill $k, exit $RC after ${SECS}s, curl exits $codes"
		for i in 1 2 3 4; do head -c 200 "$T/c$i.out" 2>/dev/null | sed 's/^/#   /'; echo; done
		sed 's/^/#   /' "$T/err.mpirun" "$T/err.0" | head -8
	fi
else
	skip "llm-serve losing a rank" "curl not found"
fi

# llm-finetune: rank 1 killed twice; the saved state resumes each time
FT=$(command -v llm-finetune)
D=tests/data/finetune
# steps enough that a kill lands mid-run: a step takes about 80 ms here,
# and a kill follows the log line that triggers it by up to 20 steps (1.6 s)
NST=160
CMP="--data $D/train.jsonl --seq-len 64 --micro-batch 2 --lr 3e-3 --seed 3 --steps $NST --save-every 1 -q"
mpijob -np 2 "$FT" -m "$S" $CMP -o "$T/whole" --log "$T/whole.csv" 2>"$T/whole.err"
check "llm-finetune -np 2: the uninterrupted $NST steps" test -f "$T/whole/adapter_model.safetensors"
# ft AT MODE...: train (resuming when a state is there); rank 1 killed once
# the log has AT steps
ft() {
	local at=$1 res=; shift
	[ -f "$T/ft/training_state.bin" ] && res=--resume
	rm -f "$T"/rc.* "$T"/err*
	mpijob "$@" -np 2 sh -c "$WRAP" "$FT" -m "$S" $CMP -o "$T/ft" --log "$T/ft.csv" $res 2>"$T/err" &
	local job=$!
	wait_until 120 sh -c "[ -f '$T/ft.csv' ] && [ \$(wc -l <'$T/ft.csv') -gt $at ]"
	kill_rank 1 "^$FT -m $S .* -o $T/ft"; local k=$?
	ended $job
	STEPS=$(($(lines "$T/ft.csv") - 1))
	return $k
}
ft 5; k=$?
check "llm-finetune, plain mpirun: rank 1 killed at step $STEPS of $NST ends the job (exit $RC, ${SECS}s); no adapter, a saved state" \
	sh -c "[ $k = 0 ] && [ $RC != 0 ] && [ $RC != 124 ] && [ $STEPS -lt $NST ] && [ ! -e '$T/ft/adapter_model.safetensors' ] && [ -f '$T/ft/training_state.bin' ]"
# resumed under --enable-recovery, rank 1 killed 3 steps after the resume
ft $(($(lines "$T/ft.csv") + 2)) --enable-recovery; k=$?
if [ $k = 0 ] && [ "$STEPS" -lt $NST ] && why=$(others_named 1 2) && [ -f "$T/ft/training_state.bin" ] && [ ! -e "$T/ft/adapter_model.safetensors" ]; then
	ok "llm-finetune, mpirun --enable-recovery, resumed, rank 1 killed at step $STEPS: rank 0 named it and exited 1 (${SECS}s); a saved state"
else
	notok "llm-finetune, --enable-recovery: kill $k, step $STEPS, ${why:-}"; grep -v PMIX "$T/err" | sed 's/^/#   /' | head -5
fi
# rank 1 killed the moment it exists, while the ranks start (inside or
# just after MPI_Init, where no watchdog ran before): rank 0 still ends,
# status 1, naming the lost rank or the start-up that did not complete
rm -f "$T"/rc.* "$T"/err*
mpijob --enable-recovery -np 2 sh -c "$WRAP" "$FT" -m "$S" $CMP -o "$T/ft0" --log "$T/ft0.csv" 2>"$T/err" &
job=$!
kill_rank 1 "^$FT -m $S .* -o $T/ft0"; k=$?
ended $job
if [ $k = 0 ] && [ $SECS -lt $BOUND ] && [ "$(cat "$T/rc.0" 2>/dev/null)" = 1 ] &&
   grep -qE "rank 0 of 2: (lost rank 1: no heartbeat|MPI_Init did not return)" "$T/err"; then
	ok "llm-finetune, mpirun --enable-recovery, rank 1 killed while starting: rank 0 exited 1 (${SECS}s): $(grep -m1 -E 'lost rank 1|MPI_Init' "$T/err")"
else
	notok "llm-finetune, rank 1 killed while starting: kill $k, ${SECS}s, rank 0 status $(cat "$T/rc.0" 2>/dev/null || echo none)"
	grep -v PMIX "$T/err" | sed 's/^/#   /' | head -5
fi
mpijob -np 2 "$FT" -m "$S" $CMP -o "$T/ft" --log "$T/ft.csv" --resume 2>"$T/err"; rc=$?
check "llm-finetune: --resume from the state saved before the second kill ends with the uninterrupted run's adapter, bit for bit (exit $rc)" \
	cmp -s "$T/whole/adapter_model.safetensors" "$T/ft/adapter_model.safetensors"
tap_done
