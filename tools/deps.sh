#!/usr/bin/env bash
# tools/deps.sh: install what the build and the test suite need, when it is
# missing; quick (about a second) when everything is there. Run by make deps,
# make demo and make test.
#   Debian packages: apt-get update + install -y as root, through sudo
#     otherwise; without either, one line naming the command to run, exit 1.
#   tests/js: the npm clients (openai, @anthropic-ai/sdk, the AI SDK, LangChain, Hugging
#     Face's @huggingface/inference; lockfile pinned, no install scripts) for
#     tests/cli/serve_openai.sh, serve_tools.sh, serve_apis.sh and
#     serve_clients.sh, when npm is present (those tests skip without).
# LLM_NO_DEPS=1 skips it all (an offline machine set up by hand).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${LLM_NO_DEPS:-0}" = 1 ] && exit 0

PACKAGES="build-essential clang libjansson-dev libpcre2-dev libutf8proc-dev
libmicrohttpd-dev libcurl4-openssl-dev libopenmpi-dev openmpi-bin python3
python3-numpy python3-jsonschema python3-locust curl gnuplot-nox iproute2"

if command -v dpkg >/dev/null && command -v apt-get >/dev/null; then
	missing=""
	for p in $PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
	if [ -n "$missing" ]; then
		echo "deps: installing Debian packages:$missing" >&2
		if [ "$(id -u)" = 0 ]; then
			as=""
		elif command -v sudo >/dev/null; then
			as="sudo"
		else
			echo "deps: not root and no sudo: run as root: apt-get update && apt-get install -y$missing" >&2
			exit 1
		fi
		t0=$SECONDS
		export DEBIAN_FRONTEND=noninteractive
		$as apt-get update -qq
		$as apt-get install -y -qq --no-install-recommends $missing >/dev/null
		echo "deps: installed in $((SECONDS - t0)) s" >&2
	fi
else
	echo "deps: not a Debian system: install the equivalents of: $(echo $PACKAGES)" >&2
fi

# the npm clients, again only when its lockfile changed since the last install
if command -v npm >/dev/null; then
	stamp=tests/js/node_modules/.package-lock.json
	if [ ! -f "$stamp" ] || [ tests/js/package-lock.json -nt "$stamp" ]; then
		echo "deps: npm ci --prefix tests/js" >&2
		npm ci --prefix tests/js --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null
	fi
else
	echo "deps: no npm: tests/cli/serve_openai.sh and serve_clients.sh will skip their client parts" >&2
fi
