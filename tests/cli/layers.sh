# tests/cli/layers.sh: the engine's include layers hold. The table is
# common/README: folders from the bottom up ("folder NAME"), and in each,
# units on floors (one unit per line: a header and the sources that
# implement it, grouped under "floor N"). For every #include "x.h" in
# common/*/*.c, *.h (and common/*.h): x.h is in a lower folder, or in the
# includer's folder on a lower floor, or of the includer's own unit, or the
# pair is in ALLOW below; there is no include cycle between units or between
# files; every file sits in the folder the table gives it, and every file the
# table names exists. Then, on the built library (libllm.a beside the
# tools under test), no two of its files call each other both ways: two
# such files are one unit split in two, whose second direction the include
# table cannot show.
#   tests/cli/layers.sh [DIR]   check the sources under DIR (default common)
#                               against the table of common/README
. tests/lib/tap.sh
dir=${1:-common}
table=common/README
# unit pairs "FROM:TO" allowed to include each other on the same floor
ALLOW=""

[ -f "$table" ] || { notok "$table exists"; tap_done; }
# "FOLDER FILE" for each source ("." for the top of DIR)
(cd "$dir" && ls *.c *.h */*.c */*.h 2>/dev/null) |
	awk -F/ '{ if (NF == 1) print ". " $1; else print $1 " " $2 }' >"$TMPD/files"
(cd "$dir" && grep -H -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' *.c *.h */*.c */*.h 2>/dev/null) |
	sed -E 's|^([^:]*/)?([^/:]*):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]*)".*$|\2 \3|' >"$TMPD/includes"
[ -s "$TMPD/files" ] || { notok "$dir holds sources"; tap_done; }

awk -v allow="$ALLOW" -v table="$table" -v dir="$dir" '
function fail(msg) { print "not ok - " msg; bad = 1 }
# depth-first search for a cycle from node N of graph G ("u" units, "f" files)
function dfs(g, n, path,    i, j, k, m, p, c) {
	state[g, n] = 1
	for (i = 1; i <= nout[g, n]; i++) {
		m = out[g, n, i]
		if (state[g, m] == 1) {
			k = split(path, p, " -> ")
			for (j = 1; p[j] != m; j++) ;
			for (c = m; ++j <= k; ) c = c " -> " p[j]
			fail("include cycle between " (g == "u" ? "units" : "files") ": " c " -> " m)
		} else if (!state[g, m])
			dfs(g, m, path " -> " m)
	}
	state[g, n] = 2
}
function edge(g, a, b) {
	if (seen[g, a, b]++) return
	out[g, a, ++nout[g, a]] = b
	if (!(g SUBSEP a in isnode)) { isnode[g, a] = 1; nodes[g, ++nn[g]] = a }
	if (!(g SUBSEP b in isnode)) { isnode[g, b] = 1; nodes[g, ++nn[g]] = b }
}
FILENAME == table && /^folder [^ \t]+/ { fo = $2; rank[fo] = ++nfolder; fl = ""; next }
FILENAME == table && /^floor [0-9]+$/ { fl = $2; next }
FILENAME == table && /^\t/ {
	u = ""
	if (fo == "" || fl == "") { fail(table ": a unit outside a folder and floor: " $1); next }
	for (i = 1; i <= NF && $i ~ /\.[ch]$/; i++) {
		if ($i in floor) fail(table ": " $i " is placed twice")
		if (u == "") { u = $i; sub(/\.[ch]$/, "", u) }
		floor[$i] = fl; unit[$i] = u; named[$i] = 1; folder[$i] = fo
	}
	next
}
FILENAME == table { next }
FILENAME ~ /files$/ {
	have[$2] = 1; nfile++; where[$2] = $1
	if ($2 in seenfile) fail(dir ": " $2 " is in two folders")
	seenfile[$2] = 1
	next
}
{ inc[++ninc] = $1 " " $2 }
END {
	n = 0
	for (f in have) if (!(f in floor)) { fail(dir "/" where[f] "/" f " has no floor in " table); n++ }
	if (!n) print "ok - every " dir "/*/*.c and *.h has a floor in " table " (" nfile " files, " nfolder " folders)"
	n = 0
	for (f in have) if ((f in folder) && folder[f] != where[f]) {
		fail(dir "/" where[f] "/" f " is in folder " folder[f] " in " table); n++
	}
	if (!n) print "ok - every file sits in the folder " table " gives it"
	n = 0
	for (f in named) if (!(f in have)) { fail(table " names " f ", which is not in " dir "/"); n++ }
	if (!n) print "ok - every file " table " names is in " dir "/"
	split(allow, al, " ")
	for (i in al) allowed[al[i]] = 1
	n = 0
	for (k = 1; k <= ninc; k++) {
		split(inc[k], e, " "); a = e[1]; b = e[2]
		if (!(a in floor) || !(b in floor)) {
			if (!(b in floor) && !(b in have)) fail(a " includes " b ", which is not in " dir "/")
			else if (!(b in floor)) fail(a " includes " b ", which has no floor")
			n++
			continue
		}
		edge("f", a, b)
		ua = unit[a]; ub = unit[b]
		if (ua == ub) continue
		edge("u", ua, ub)
		if (rank[folder[a]] > rank[folder[b]]) continue
		if (rank[folder[a]] < rank[folder[b]]) {
			fail(a " (folder " folder[a] ") includes " b " (folder " folder[b] ", a higher one)")
			n++
			continue
		}
		if (floor[a] > floor[b]) continue
		if (floor[a] == floor[b] && ((ua ":" ub) in allowed)) continue
		fail(a " (floor " floor[a] ") includes " b " (floor " floor[b] (floor[a] == floor[b] ? ", another unit" : "") ")")
		n++
	}
	if (!n) print "ok - every include goes down a folder, or down a floor of its folder, or stays in its unit (" ninc " includes)"
	for (g = 0; g < 2; g++) {
		gg = g ? "f" : "u"
		bad_before = bad; bad = 0
		for (i = 1; i <= nn[gg]; i++) if (!state[gg, nodes[gg, i]]) dfs(gg, nodes[gg, i], nodes[gg, i])
		if (!bad) print "ok - no include cycle between " (g ? "files" : "units")
		bad = bad || bad_before
	}
	exit bad
}' "$table" "$TMPD/files" "$TMPD/includes" || tap_fail=1

# calls between the library's objects, from its symbol table: "A B" when A
# uses a function or datum B defines
lib=${LLM_TESTBIN:+$LLM_TESTBIN/../libllm.a}
if [ -z "$lib" ] || [ ! -f "$lib" ] || ! command -v nm >/dev/null; then
	skip "no two files of libllm.a call each other both ways" "no libllm.a beside \$LLM_TESTBIN (or no nm)"
else
	nm -A "$lib" 2>/dev/null | awk '{
		n = split($1, a, ":"); obj = a[n - 1]
		if ($2 == "U") use[++nu] = obj " " $3
		else if (NF == 3 && $2 ~ /^[TDRBVWC]$/) def[$3] = obj
	} END {
		for (i = 1; i <= nu; i++) {
			split(use[i], x, " ")
			if ((x[2] in def) && def[x[2]] != x[1] && !seen[x[1], def[x[2]], x[2]]++)
				print x[1], def[x[2]], x[2]
		}
	}' >"$TMPD/calls"
	awk '{ k = $1 " " $2; e[k] = e[k] (e[k] == "" ? "" : ",") $3 }
	END {
		n = 0
		for (k in e) {
			split(k, x, " ")
			r = x[2] " " x[1]
			if ((r in e) && x[1] < x[2]) {
				print "not ok - " x[1] " and " x[2] " call each other: " x[1] " uses " e[k] "; " x[2] " uses " e[r]
				n++
			}
		}
		if (!n) print "ok - no two files of libllm.a call each other both ways"
		exit n > 0
	}' "$TMPD/calls" || tap_fail=1
fi
tap_done
