# tests/cli/examples.sh: the examples of README.md and of the man pages run
# as written, one TAP line per command.
#
# What is an example: a fenced ```sh block of README.md; a .nf/.fi block in
# the EXAMPLES section of man/*.1 and man/*.5 (roff escapes undone: \e and
# \\ are a backslash, \- a dash, \(dq a double quote). A command is one
# complete shell command of a block (continued lines, open quotes and
# trailing pipes joined; `bash -n` decides).
#
# Which run: a block that names an llm-tools program (llm-generate, ...),
# the shipped model (stories260K) or the server's port (:8080) runs, command by command, in order, each
# document in one session (variables, files and background servers carry
# from block to block, as for a reader typing them in order). Other blocks
# (installing packages, building, fuzzing) are not run; their lines are
# listed as comments. A command that is `make ...` is not run either: the
# tools under test are those of $LLM_BIN.
#
# The marker: a block holding a comment line "# needs WHAT" (in the block
# itself, so the reader sees it too) is skipped, one SKIP line naming WHAT.
# The convention in the docs is "# needs a bigger model: any Hugging Face
# Llama directory" (or which model), "# needs N GB of disk: ...". Any
# unmarked command that fails is a failure.
#
# Where: README.md runs in a scratch clone ($TMPD/readme/clone: links to the
# tracked files, bin/ to $LLM_BIN) beside $TMPD/readme/shared/models (the
# shipped models), so "bin/llm-..." and "../shared/models/stories260K"
# read as written. Man pages name the installed tools bare (bin/ goes on
# PATH) and the model models/stories260K: each runs in its own scratch
# directory holding models/stories260K, configs/ and tests/data/.
# Three rewrites keep runs apart on a shared machine: /tmp/ becomes the
# scratch directory's tmp/, port 8080 a free port, and mpirun gets
# --oversubscribe (and --allow-run-as-root as root, as the docs say). After
# a command that starts a server in the background (ending in &) the test
# waits until the port answers /health (a reader waits for it to start);
# background processes are ended when their document is done.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then
	skip "the examples of README.md and the man pages" "no stories260K model in \$LLM_TEST_MODELS"
	tap_done
fi
REPO=$PWD
MODELS=$(cd "$LLM_TEST_MODELS" && pwd)
BIN=$(cd "$LLM_BIN" && pwd)
MPIRUN=""
if command -v mpirun >/dev/null 2>&1; then
	MPIRUN="mpirun --oversubscribe"
	[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi

# extract DOC: the document's example blocks as a bash script of TAP lines
# (see above), run in the current directory
extract() {
python3 - "$1" "$REPO" <<'PY'
import re, subprocess, sys
doc, repo = sys.argv[1], sys.argv[2]
lines = open(repo + "/" + doc).read().split("\n")
blocks = []                       # (first line number, [lines])
if doc.endswith(".md"):
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            blocks.append((i + 2, lines[i + 1:j]))
            i = j
        i += 1
else:
    on = False; cur = None
    for n, l in enumerate(lines, 1):
        if l.startswith(".SH"):
            on = l.startswith(".SH EXAMPLES")
        elif on and l == ".nf":
            cur = (n + 1, [])
        elif on and l == ".fi" and cur:
            blocks.append(cur); cur = None
        elif cur is not None:
            t = l.replace("\\\\", "\0").replace("\\e", "\0").replace("\\-", "-").replace("\\(dq", '"')
            cur[1].append(t.replace("\0", "\\"))

def complete(text):
    s = text.rstrip()
    if s.endswith("\\") or s.endswith("|") or s.endswith("&&") or s.endswith("||"):
        return False
    return subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0

tool = re.compile(r"\bllm-(generate|serve|quantize|repartition|finetune|bench)\b|stories260K|:8080\b")
def out(*f):                      # one record: three NUL-terminated fields
    sys.stdout.write("".join(x + "\0" for x in (f + ("", ""))[:3]))
for first, body in blocks:
    where = "%s:%d" % (doc, first)
    text = "\n".join(body)
    need = [l.strip()[2:] for l in body if re.match(r"\s*# needs ", l)]
    if need:
        out("skip", "%s: %s" % (where, body[-1].strip()), need[0])
        continue
    if not tool.search(text):
        out("diag", "%s: not run (no llm-tools command): %s" % (where, body[0].strip()))
        continue
    cmd, start = [], first
    for k, l in enumerate(body):
        if not cmd and (not l.strip() or l.strip().startswith("#")):
            continue
        if not cmd:
            start = first + k
        cmd.append(l)
        c = "\n".join(cmd)
        if complete(c):
            out("run", "%s:%d" % (doc, start), c.strip())
            cmd = []
    if cmd:
        out("notok", "%s:%d: an incomplete command: %s" % (doc, start, cmd[0].strip()))
PY
}

# the rewrites of a command (see above)
rewrite() {
	local c=${1//\/tmp\//$SCR/tmp/}
	c=${c//8080/$PORT}
	[ -n "$MPIRUN" ] && c=$(printf '%s' "$c" | sed -e "s/\bmpirun --allow-run-as-root\b/mpirun/g" -e "s/\bmpirun\b/$MPIRUN/g")
	printf '%s' "$c"
}
health() { curl -sf -m 5 "http://127.0.0.1:$PORT/health" >/dev/null; }

# run WHERE CMD: one command of the session, one TAP line
n_cmd=0
run() {
	local where=$1 c short
	short=$(printf '%s' "$2" | head -1 | cut -c1-90)
	n_cmd=$((n_cmd + 1))
	if [[ $2 =~ ^make( |$) ]]; then diag "$where: not run (the tools under test are built): $short"; return; fi
	if [[ $2 == *mpirun* ]] && [ -z "$MPIRUN" ]; then skip "$where: $short" "mpirun not found"; return; fi
	c=$(rewrite "$2")
	local log=$SCR/log.$n_cmd
	if [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*=[^\ \;\|\&]*$ ]]; then
		export "${c?}"; ok "$where: $short"; return
	fi
	# a server started in the background: "CMD &", a comment after it allowed
	local bare; bare=$(printf '%s' "$c" | sed -E "s/[[:space:]]+#[^'\"]*\$//")
	if [[ $bare == *'&' ]] && [[ $bare != *'&&' ]]; then
		c=$bare
		setsid bash -c "${c%&}" >"$log" 2>&1 </dev/null &
		bg+=($!)
		ln -sf "$log" "$SCR/log.bg.$!"
		if wait_until 120 health; then ok "$where: $short (up on port $PORT)"
		else notok "$where: $short (no /health answer on port $PORT in 120 s)"; sed 's/^/#   /' "$log" | tail -5; fi
		return
	fi
	if timeout 900 bash -c "$c" >"$log" 2>&1 </dev/null; then ok "$where: $short"
	else
		notok "$where: $short (exit $?)"; sed 's/^/#   /' "$log" | tail -8
		for p in "${bg[@]+"${bg[@]}"}"; do sed 's/^/#   server: /' "$SCR/log.bg.$p" 2>/dev/null | tail -5; done
	fi
}

# session DOC DIR: DOC's examples, in DIR
session() {
	local doc=$1 op a b
	SCR=$T/$(basename "$doc")
	mkdir -p "$SCR/tmp"
	# a free port below the kernel's ephemeral range, so that no server of a
	# test running beside this one (--port 0) can be given it meanwhile
	PORT=$(python3 -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for p in random.sample(range(20000, min(lo, 32768)), 200):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); print(p); break
    except OSError:
        pass
    finally:
        s.close()')
	extract "$doc" >"$SCR/plan" || { notok "$doc: its examples could not be read"; return; }
	bg=()
	(
		cd "$2" || exit 1
		while IFS= read -r -d '' op && IFS= read -r -d '' a && IFS= read -r -d '' b; do
			case $op in
			run) run "$a" "$b" ;;
			skip) skip "$a" "$b" ;;
			diag) diag "$a" ;;
			notok) notok "$a" ;;
			esac
		done <"$SCR/plan"
		for p in "${bg[@]+"${bg[@]}"}"; do kill -- -"$p" 2>/dev/null; done
		wait
		exit $tap_fail
	) || tap_fail=1
}

# README.md: a scratch clone beside the shipped models
C=$T/readme/clone
mkdir -p "$C" "$T/readme/shared"
ln -s "$MODELS" "$T/readme/shared/models"
for f in $(git ls-files | cut -d/ -f1 | sort -u); do ln -s "$REPO/$f" "$C/$f"; done
ln -s "$BIN" "$C/bin"
PATH_TAP=$PATH
PATH=${PATH#"$LLM_BIN":}   # a fresh clone: the tools are bin/llm-..., not on PATH
command -v llm-generate >/dev/null && diag "llm-generate is on PATH outside \$LLM_BIN: README.md's bare names would pass"
session README.md "$C"
PATH=$PATH_TAP

# the man pages: the installed tools on PATH, models/stories260K
PATH="$BIN:$PATH"
for m in man/*.1 man/*.5; do
	D=$T/man-$(basename "$m")
	mkdir -p "$D/models" "$D/tests"
	ln -s "$MODELS/stories260K" "$D/models/stories260K"
	ln -s "$REPO/configs" "$D/configs"
	ln -s "$REPO/tests/data" "$D/tests/data"
	session "$m" "$D"
done
tap_done
