#!/usr/bin/env python3
# tests/lib/progress_check.py: checks the stderr of a tool run against the
# progress and summary lines of common/base/progress.c, counting from the files.
#
#   progress_check.py write ERR PROG IN OUT [--progress]
#       ERR ends with "PROG: read SIZE (N tensors), wrote SIZE (M tensors,
#       F files) to OUT in T s, SIZE/s" where N and the first SIZE are the
#       tensors and data bytes of IN ("" for --random: no "read" part), M, F
#       and the second SIZE those of OUT (a .safetensors file, or a directory:
#       every *.safetensors in it). Every other line is a plain progress line
#       ("PROG:  P%  i/M tensors  SIZE/SIZE  SIZE/s  [ETA E s]  T s", no
#       carriage return) with P and i never going down; --progress: at least
#       one, else none.
#   progress_check.py lines ERR PROG NOUN
#       every line but the last is "PROG: NOTE  P%  i/N NOUN  T s" with
#       0 <= i <= N, and there is at least one.
# Exit 0 when all holds; otherwise 1 with the reason on stderr.
import glob
import json
import os
import re
import struct
import sys


def human(b):
    """The sizes of llm_progress_size: decimal units, one decimal below 100."""
    units = ['B', 'kB', 'MB', 'GB', 'TB', 'PB', 'EB']
    v, u = float(b), 0
    while v >= 999.95 and u < 6:
        v /= 1000
        u += 1
    if u == 0:
        return '%d B' % b
    return ('%.1f %s' if v < 99.95 else '%.0f %s') % (v, units[u])


def safetensors(path):
    """(tensors, data bytes) of one file."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        h = json.loads(f.read(n))
    ts = [v for k, v in h.items() if k != '__metadata__']
    return len(ts), sum(v['data_offsets'][1] - v['data_offsets'][0] for v in ts)


def ckpt(path):
    """(tensors, data bytes, files) of a file or a directory."""
    files = sorted(glob.glob(os.path.join(path, '*.safetensors'))) if os.path.isdir(path) else [path]
    c = [safetensors(f) for f in files]
    return sum(x[0] for x in c), sum(x[1] for x in c), len(files)


def fail(msg):
    sys.stderr.write('progress_check: %s\n' % msg)
    sys.exit(1)


def main():
    a = sys.argv[1:]
    raw = open(a[1], 'rb').read().decode()
    if '\r' in raw:
        fail('a carriage return on a stream that is not a terminal')
    lines = raw.splitlines()
    if not lines:
        fail('stderr is empty')
    prog = re.escape(a[2])
    size = r'([0-9.]+ [kMGTPE]?B)'
    if a[0] == 'lines':
        noun = re.escape(a[3])
        if len(lines) < 2:
            fail('no progress line before the summary: %r' % lines)
        for l in lines[:-1]:
            m = re.fullmatch(prog + r': \S.*? +(\d+)%  (\d+)/(\d+) ' + noun + r'  \d+ s', l)
            if not m or not 0 <= int(m[2]) <= int(m[3]):
                fail('not a progress line: %r' % l)
        return
    src, out = a[3], a[4]
    n_out, b_out, f_out = ckpt(out)
    read = ''
    if src:
        n_in, b_in, _ = ckpt(src)
        read = r'read ' + re.escape(human(b_in)) + r' \(%d tensors\), ' % n_in
    want = (prog + r': ' + read + r'wrote ' + re.escape(human(b_out)) + r' \(%d tensors, %d files?\) to .+ in [0-9.]+ s, '
            % (n_out, f_out) + size + '/s')
    if not re.fullmatch(want, lines[-1]):
        fail('summary %r does not match /%s/' % (lines[-1], want))
    last = (0, 0)
    for l in lines[:-1]:
        m = re.fullmatch(prog + r': +(\d+)%  (\d+)/(\d+) tensors  ' + size + '/' + size + '  ' + size
                         + r'/s(  ETA \d+ s)?  \d+ s', l)
        if not m:
            fail('not a progress line: %r' % l)
        p, i = int(m[1]), int(m[2])
        if int(m[3]) != n_out or m[5] != human(b_out) or p > 100 or (p, i) < last or p < last[0] or i < last[1]:
            fail('progress line %r: total other than %d tensors, %s, or going down' % (l, n_out, human(b_out)))
        last = (p, i)
    if ('--progress' in a) != (len(lines) > 1):
        fail('%d progress lines (%s)' % (len(lines) - 1, 'want some' if '--progress' in a else 'want none'))


main()
