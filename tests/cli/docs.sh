# tests/cli/docs.sh: the man pages agree with the tools. For every tool in
# bin/: a man page exists, its SYNOPSIS equals the --help usage line, and
# every long option --help lists appears in the man page's OPTIONS. Every
# page renders without a roff warning, and no page has a bare \n (roff reads
# it as a register: printf '%s\n' printed as "printf '%s0 '"; write \en) or
# a line ending in a bare \ (roff joins the next line to it; write \e).
# Their examples run in tests/cli/examples.sh.
. tests/lib/tap.sh

# the text of section SEC of man page F, roff requests dropped and escapes undone
section() {
	awk -v sec="$2" '/^\.SH /{on = ($2 == sec); next} on && !/^\.(TP|PP|nf|fi|IP|RS|RE)/' "$1" |
		sed -e 's/^\.[BIR]* //' -e 's/\\f[BIRP]//g' -e 's/\\-/-/g' -e 's/\\(+-/±/g' -e 's/"//g'
}

for t in "$LLM_BIN"/llm-*; do
	[ -x "$t" ] || continue
	n=$(basename "$t")
	m=man/$n.1
	if [ ! -f "$m" ]; then notok "$n has a man page ($m)"; continue; fi
	ok "$n has a man page"
	usage=$("$t" --help | sed -n 's/^usage: //p' | head -1)
	syn=$(section "$m" SYNOPSIS | sed '/^$/d' | head -1)
	if [ -n "$usage" ] && [ "$usage" = "$syn" ]; then ok "$n: SYNOPSIS equals the --help usage line"
	else notok "$n: SYNOPSIS '$syn' differs from usage '$usage'"; fi
	opts=$(section "$m" OPTIONS)
	missing=""
	for o in $("$t" --help | grep -o -- '--[a-z0-9][a-z0-9-]*' | sort -u); do
		printf '%s\n' "$opts" | grep -q -- "$o\b" || missing="$missing $o"
	done
	if [ -z "$missing" ]; then ok "$n: every long option of --help is in the man page"
	else notok "$n: options missing from $m:$missing"; fi
	missing=""
	for s in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT" EXAMPLES; do
		grep -q "^\.SH \"*$s" "$m" || missing="$missing $s"
	done
	[ -z "$missing" ] && ok "$n: the man page has NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, EXAMPLES" ||
		notok "$n: man page sections missing:$missing"
done
for m in man/*.[1-8]; do
	bad=$(perl -ne 'print "$.: $_" if /(?<!\\)(?:\\\\)*\\(n|$)/' "$m")
	if [ -z "$bad" ]; then ok "$m: no unescaped \\n or line-ending \\ (roff's register escape, line join)"
	else notok "$m: an unescaped \\n or line-ending \\ (write \\en, \\e):"; printf '%s\n' "$bad" | sed 's/^/#   /'; fi
	if command -v groff >/dev/null 2>&1; then
		w=$(groff -ww -man -Tutf8 -z "$m" 2>&1)
		if [ -z "$w" ]; then ok "$m: renders without a roff warning"
		else notok "$m: roff warnings"; printf '%s\n' "$w" | sed 's/^/#   /' | head -5; fi
	else
		skip "$m renders without a roff warning" "groff not found (apt-get install groff-base)"
	fi
done
check "llm-checkpoint.5 documents the FP8 layout" grep -q weight_scale_inv man/llm-checkpoint.5
tap_done
