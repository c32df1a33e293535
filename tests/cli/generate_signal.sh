# tests/cli/generate_signal.sh: an interrupted llm-generate batch keeps its
# results. SIGINT (exit 130) or SIGTERM (143) during a 3000-prompt stdin
# batch: every result finished is written whole, in input order, the rest
# are cancelled, and one stderr line counts the results written.
#
# No timing: llm-generate writes into a FIFO this script reads. It reads
# two lines, then stops reading, so llm-generate blocks in write once the
# pipe is full (64 KiB; the whole batch writes about 1 MB): when the signal
# is sent the batch cannot have finished. Then the script reads the rest.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then
	skip "llm-generate interrupted" "no stories260K model in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)
python3 -c "
for i in range(3000): print(['Once upon a time', 'Lily and Tom', 'The cat sat', 'One day a boy'][i % 4], i)" >"$T/prompts.txt"
GEN=(llm-generate -m "$M" --temp 0 -n 24 --parallel 8)

# interrupt SIGNAL OUT [FLAGS...]: run the batch into OUT, signal it after two
# lines, read the rest; $rc gets its exit status, OUT.err its stderr
interrupt() {
	local sig=$1 out=$2 line pid; shift 2
	rm -f "$T/fifo"; mkfifo "$T/fifo"
	"${GEN[@]}" "$@" <"$T/prompts.txt" >"$T/fifo" 2>"$out.err" &
	pid=$!
	exec 3<"$T/fifo"
	: >"$out"
	for _ in 1 2; do IFS= read -r -t 120 line <&3 && printf '%s\n' "$line" >>"$out"; done
	kill -"$sig" "$pid"
	timeout 300 cat <&3 >>"$out"
	exec 3<&-
	wait "$pid"; rc=$?
}

# same OUT [FLAGS...]: the JSONL lines of OUT are whole and valid, each
# equal (timings aside) to its prompt's line from an uninterrupted run of
# the prompts up to the last one printed, and the stderr line counts them
same_jsonl() {
	local out=$1 k; shift
	k=$(python3 -c "import json, sys; print(max(json.loads(l)['index'] for l in open(sys.argv[1])) + 1)" "$out") || return 1
	head -n "$k" "$T/prompts.txt" | "${GEN[@]}" "$@" >"$out.ref" || return 1
	python3 - "$out" "$out.ref" "$(cat "$out.err")" <<'PY'
import json, re, sys
data = open(sys.argv[1], "rb").read()
assert data.endswith(b"\n"), "the last line is cut"
ref = {}
for l in open(sys.argv[2]):
    o = json.loads(l); o.pop("timings"); ref[o["index"]] = o
lines = data.decode().splitlines()
idx = []
for l in lines:
    o = json.loads(l); o.pop("timings")
    assert o == ref[o["index"]], "prompt %d differs" % o["index"]
    assert o["finish_reason"] != "cancel", "a cancelled prompt was written"
    idx.append(o["index"])
assert idx == sorted(set(idx)), "not in input order"
m = re.fullmatch(r"llm-generate: interrupted: (\d+) of 3000 prompts done, results written", sys.argv[3])
assert m, "stderr: %r" % sys.argv[3]
assert int(m.group(1)) == len(lines), "stderr counts %s, %d lines written" % (m.group(1), len(lines))
assert 2 <= len(lines) < 3000
PY
}

interrupt INT "$T/int.jsonl" --json
check "SIGINT during a 3000-prompt --json batch: exit 130" [ "$rc" = 130 ]
check "SIGINT: every line written is whole JSON, in input order, equal to the uninterrupted run's; stderr counts them" \
	same_jsonl "$T/int.jsonl" --json

interrupt TERM "$T/term.jsonl" --json
check "SIGTERM during a 3000-prompt --json batch: exit 143" [ "$rc" = 143 ]
check "SIGTERM: every line written is whole JSON, in input order, equal to the uninterrupted run's; stderr counts them" \
	same_jsonl "$T/term.jsonl" --json

# text mode: line i is prompt i's text, so the lines are the first prompts'
same_text() {
	local n; n=$(wc -l <"$T/int.txt")
	head -n "$n" "$T/prompts.txt" | "${GEN[@]}" >"$T/int.txt.ref" &&
	cmp -s "$T/int.txt" "$T/int.txt.ref" &&
	[ "$(cat "$T/int.txt.err")" = "llm-generate: interrupted: $n of 3000 prompts done, results written" ] &&
	[ "$n" -ge 2 ] && [ "$n" -lt 3000 ]
}
interrupt INT "$T/int.txt"
check "SIGINT during a 3000-prompt text batch: exit 130" [ "$rc" = 130 ]
check "SIGINT, text: the lines written are the first prompts' of an uninterrupted run; stderr counts them" same_text

# a second signal ends it at once: llm-generate blocks in write (the FIFO
# is not read) after the first, so only the second can end it. Two
# different signals, so that the kernel cannot merge them into one.
rm -f "$T/fifo"; mkfifo "$T/fifo"
"${GEN[@]}" --json <"$T/prompts.txt" >"$T/fifo" 2>"$T/twice.err" &
pid=$!
exec 3<"$T/fifo"
IFS= read -r -t 120 line <&3
kill -INT "$pid"; kill -TERM "$pid"
wait_until 120 sh -c "! kill -0 $pid 2>/dev/null"
wait "$pid"; rc=$?
exec 3<&-
check "a second signal ends a blocked batch at once (exit $rc: 128 + the second signal), without the summary line" \
	sh -c "{ [ $rc = 143 ] || [ $rc = 130 ]; } && [ ! -s '$T/twice.err' ]"

# --score: the items scored are written whole, in input order, and equal
# an uninterrupted run's; the stderr line counts them
python3 -c "
import json
for i in range(3000):
    print(json.dumps({'context': ['Once upon a time', 'Lily and Tom', 'The cat sat'][i % 3] + ' %d' % i,
                      'continuations': [' there was a girl', ' they played', ' on the mat']}))" >"$T/items.jsonl"
rm -f "$T/fifo"; mkfifo "$T/fifo"
llm-generate -m "$M" --score --parallel 8 <"$T/items.jsonl" >"$T/fifo" 2>"$T/score.err" &
pid=$!
exec 3<"$T/fifo"
: >"$T/score.jsonl"
for _ in 1 2; do IFS= read -r -t 120 line <&3 && printf '%s\n' "$line" >>"$T/score.jsonl"; done
kill -INT "$pid"
timeout 300 cat <&3 >>"$T/score.jsonl"
exec 3<&-
wait "$pid"; rc=$?
check "SIGINT during 3000 --score items: exit 130" [ "$rc" = 130 ]
same_score() {
	local n; n=$(wc -l <"$T/score.jsonl")
	head -n "$n" "$T/items.jsonl" | llm-generate -m "$M" --score --parallel 8 >"$T/score.ref" &&
	cmp -s "$T/score.jsonl" "$T/score.ref" &&
	[ "$(cat "$T/score.err")" = "llm-generate: interrupted: $n of 3000 items scored, results written" ] &&
	[ "$n" -ge 2 ] && [ "$n" -lt 3000 ]
}
check "SIGINT, --score: the lines written are the first items' of an uninterrupted run; stderr counts them" same_score

# distributed: rank 0 decides (the signal goes to its process, not to
# mpirun, which ends the whole job on one); rank 1 follows its steps to
# the close, and mpirun passes on rank 0's status
need_mpirun "an interrupted batch under mpirun"
llm-repartition -q "$M" "$T/tp2" --tp 2
rank0() {   # the pid of rank 0 of the job over $T/tp2
	local p
	for p in $(pgrep -f -- "-m $T/tp2"); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && echo "$p" && return 0
	done
	return 1
}
GEN=($MPIRUN -np 2 llm-generate -m "$T/tp2" --temp 0 -n 24 --parallel 8)
rm -f "$T/fifo"; mkfifo "$T/fifo"
"${GEN[@]}" --json <"$T/prompts.txt" >"$T/fifo" 2>"$T/mpi.jsonl.err" &
pid=$!
exec 3<"$T/fifo"
: >"$T/mpi.jsonl"
for _ in 1 2; do IFS= read -r -t 120 line <&3 && printf '%s\n' "$line" >>"$T/mpi.jsonl"; done
r0=$(rank0)
kill -INT "$r0"
timeout 300 cat <&3 >>"$T/mpi.jsonl"
exec 3<&-
wait "$pid"; rc=$?
check "mpirun -np 2, SIGINT to rank 0: exit 130" [ "$rc" = 130 ]
grep '^llm-generate: interrupted' "$T/mpi.jsonl.err" >"$T/mpi.jsonl.err1"   # mpirun adds its own lines
mv "$T/mpi.jsonl.err1" "$T/mpi.jsonl.err"
check "mpirun -np 2: every line written is whole JSON, in input order, equal to the uninterrupted run's; stderr counts them" \
	same_jsonl "$T/mpi.jsonl" --json
tap_done
