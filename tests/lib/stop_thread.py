# tests/lib/stop_thread.py: stop one thread of a running process, alone,
# for tests that need a part of a server to hang (tests/cli/serve_stall.sh).
# The thread is found by name (/proc/PID/task/TID/comm) and stopped with
# ptrace (PTRACE_SEIZE, then PTRACE_INTERRUPT: that thread stops, the
# process's other threads run on). Prints "stopped TID" once it is stopped,
# holds it until standard input ends, then lets it go (PTRACE_DETACH) and
# prints "released". Exits 77 with a line where ptrace is not permitted
# (a container without CAP_SYS_PTRACE, Yama's ptrace_scope).
#
# usage: stop_thread.py PID NAME
import ctypes
import os
import sys

PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT, WALL = 17, 0x4206, 0x4207, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
pid, name = int(sys.argv[1]), sys.argv[2]
tid = None
for t in os.listdir(f'/proc/{pid}/task'):
    with open(f'/proc/{pid}/task/{t}/comm') as f:
        if f.read().strip() == name:
            tid = int(t)
if tid is None:
    print(f'no thread named {name} in process {pid}', flush=True)
    sys.exit(1)
if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
    print(f'ptrace: {os.strerror(ctypes.get_errno())}', flush=True)
    sys.exit(77)
libc.ptrace(PTRACE_INTERRUPT, tid, None, None)
os.waitpid(tid, WALL)
print(f'stopped {tid}', flush=True)
sys.stdin.read()
libc.ptrace(PTRACE_DETACH, tid, None, None)
print('released', flush=True)
