#!/usr/bin/env python3
"""Hold many idle NBD connections against a server and report its threads
and resident memory, from /proc: before, with them open, and after they
close; and whether a new client is served beside them.

Usage: idle-connections.py --pid PID (--unix PATH | --tcp HOST:PORT) [-n 10000]

Each connection does the fixed-newstyle handshake (NBD_OPT_GO), one 4 KiB
WRITE and its reply, then stays open and silent. Raises this process's
open-file limit to its hard limit first (the server raises its own).
"""
import argparse
import resource
import socket
import struct
import sys
import time

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REP_MAGIC = 0x0003E889045565A9
OPT_GO = 7
REP_ACK = 1
REQ_MAGIC = 0x25609513
SIMPLE_MAGIC = 0x67446698
CMD_WRITE = 1
CMD_READ = 0


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError("server closed the connection")
        b += chunk
    return b


def connect(args):
    if args.unix:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(args.unix)
    else:
        host, port = args.tcp.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    magic, opt, _flags = struct.unpack(">QQH", recv_exact(s, 18))
    assert (magic, opt) == (NBDMAGIC, IHAVEOPT), "not an NBD server"
    s.sendall(struct.pack(">I", 3))  # FIXED_NEWSTYLE | NO_ZEROES
    data = struct.pack(">I", 0) + struct.pack(">H", 0)  # empty name, no info requests
    s.sendall(struct.pack(">QII", IHAVEOPT, OPT_GO, len(data)) + data)
    while True:
        magic, opt, rtype, length = struct.unpack(">QIII", recv_exact(s, 20))
        assert magic == REP_MAGIC
        recv_exact(s, length)
        if rtype == REP_ACK:
            return s
        assert rtype == 3, f"NBD_OPT_GO refused: {rtype:#x}"  # NBD_REP_INFO


def request(s, cmd, cookie, offset, length, payload=b""):
    s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, cmd, cookie, offset, length) + payload)
    magic, error, got = struct.unpack(">IIQ", recv_exact(s, 16))
    assert magic == SIMPLE_MAGIC and got == cookie and error == 0, (magic, error, got)
    return recv_exact(s, length) if cmd == CMD_READ else b""


def proc_status(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "Threads"):
            out[k] = int(v.split()[0])
    return out["VmRSS"], out["Threads"]


def report(label, pid, base=None):
    rss, threads = proc_status(pid)
    extra = ""
    if base is not None:
        extra = f" (+{(rss - base) / 1024:.1f} MiB over the start)"
    print(f"{label}: {threads} threads, {rss / 1024:.1f} MiB resident{extra}", flush=True)
    return rss, threads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True, help="the server's process id")
    ap.add_argument("--unix")
    ap.add_argument("--tcp")
    ap.add_argument("-n", type=int, default=10000)
    ap.add_argument("--settle", type=float, default=1.0, help="seconds to wait before measuring")
    args = ap.parse_args()
    if not (args.unix or args.tcp):
        sys.exit("give --unix PATH or --tcp HOST:PORT")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.n + 16 > hard:
        sys.exit(f"open-file hard limit {hard} is below {args.n} connections")

    rss0, _ = report("start", args.pid)
    conns = []
    t0 = time.time()
    for i in range(args.n):
        try:
            s = connect(args)
            request(s, CMD_WRITE, 1, (i % 1024) * 4096, 4096, bytes([i % 256]) * 4096)
        except (OSError, EOFError, AssertionError) as e:
            print(f"connection {i + 1} failed: {e!r}; measuring the {len(conns)} open", flush=True)
            break
        conns.append(s)
    print(f"opened {len(conns)} connections in {time.time() - t0:.1f} s", flush=True)
    args.n = len(conns)
    time.sleep(args.settle)
    rss1, threads1 = report(f"{args.n} idle connections", args.pid, rss0)
    print(f"  {(rss1 - rss0) * 1024 / args.n:.0f} bytes resident per connection", flush=True)

    t = time.time()
    try:
        s = connect(args)
        data = request(s, CMD_READ, 7, 5 * 4096, 4096)
        assert data == bytes([5]) * 4096, "wrong data"
        print(f"a new client beside them: handshake + READ in {(time.time() - t) * 1000:.1f} ms", flush=True)
        data = request(conns[5], CMD_READ, 8, 5 * 4096, 4096)
        assert data == bytes([5]) * 4096, "wrong data"
        s.close()
    except (OSError, EOFError, AssertionError) as e:
        print(f"a new client beside them was not served: {e!r}", flush=True)

    for s in conns:
        s.close()
    time.sleep(args.settle)
    report("all closed", args.pid, rss0)


if __name__ == "__main__":
    main()
