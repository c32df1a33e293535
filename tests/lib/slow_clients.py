# tests/lib/slow_clients.py: slow clients for tests/cli/serve_attack.sh.
# Opens N TCP connections from a source address to a server and sends on
# each the start of something it never finishes: an HTTP request cut in its
# headers ("http") or the first bytes of a TLS ClientHello ("tls"). Then it
# watches them and keeps STATUS (rewritten atomically on every change) as
# "connected C closed K": C connections were made, K of them the server has
# since closed (end of file or reset). Runs until killed.
#
# usage: slow_clients.py SRC_ADDR PORT N MODE STATUS
import os
import resource
import selectors
import socket
import sys

src, port, n, mode, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
start = {
    'http': b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n',
    'tls': b'\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03',
}[mode]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 64:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def write_status(connected, closed):
    tmp = f'{status}.tmp'
    with open(tmp, 'w') as f:
        f.write(f'connected {connected} closed {closed}\n')
    os.replace(tmp, status)


sel = selectors.DefaultSelector()
connected = closed = 0
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(('127.0.0.1', port))
    try:
        s.sendall(start)
    except OSError:
        pass                    # closed already: seen below as end of file
    sel.register(s, selectors.EVENT_READ)
    connected += 1
write_status(connected, closed)
while True:
    for key, _ in sel.select():
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b''
        if not data:            # an answer (say, 400) is read until the close
            sel.unregister(key.fileobj)
            key.fileobj.close()
            closed += 1
            write_status(connected, closed)
