# tests/cli/depth.sh: bench/depth.sh, llm-generate's top-10 log-probs against
# llama.cpp's, cannot rot: its stories260K mode (the real model's F32 GGUF,
# 4 positions up to 510) runs here on the tools of this build when the
# prebuilt llama.cpp of npm's node-llama-cpp is on this machine (bench/
# engine.sh puts it in /tmp/llm-bench-engine/npm; nothing is downloaded
# here), and its comparison must hold at 2e-3 and fail at 1e-9.
. tests/lib/tap.sh
T=$TMPD
NPM_DIR=${LLM_TEST_NPM:-/tmp/llm-bench-engine/npm}
LIB=$NPM_DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
why=
have_stories || why="no stories260K in \$LLM_TEST_MODELS"
[ -f "$(stories)/stories260K-f32.gguf" ] || why=${why:-"no stories260K-f32.gguf in \$LLM_TEST_MODELS"}
[ -f "$LIB/libggml-base.so" ] || why=${why:-"no node-llama-cpp in $NPM_DIR (bench/engine.sh installs it)"}
[ -f "$NPM_DIR/llsrc/include/llama.h" ] || [ -f "$NPM_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle" ] ||
	why=${why:-"no llama.cpp headers or source bundle in $NPM_DIR"}
if [ -n "$why" ]; then
	skip "bench/depth.sh: llama.cpp and llm-generate agree at 4 stories260K positions" "$why"
	skip "bench/depth.sh: a tolerance of 1e-9 fails with exit 3" "$why"
	tap_done
fi
export MODEL=stories260K STORIES=$(stories) POSITIONS="0 100 300 510" LLAMA_LIB=$LIB NPM_DIR LLM_BIN
bench/depth.sh "$T/w" >"$T/out" 2>"$T/err"; rc=$?
sed 's/^/#   /' "$T/out" "$T/err"
check "bench/depth.sh: llama.cpp and llm-generate agree at 4 stories260K positions (exit $rc)" python3 - "$T/out" "$rc" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1] == " " or l[:1].isdigit()]
assert sys.argv[2] == "0", sys.argv[2]
assert [r[0] for r in rows] == ["0", "100", "300", "510"], rows
for r in rows:
    assert r[3] == "same" and r[4] == "same" and float(r[5]) <= 2e-3 and r[6] == "yes", r
PY
TOL=1e-9 bench/depth.sh "$T/w" >"$T/out2" 2>&1; rc=$?
check "bench/depth.sh: a tolerance of 1e-9 fails with exit 3 (exit $rc)" [ "$rc" = 3 ]
tap_done
