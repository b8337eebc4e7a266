"""Several daphne processes on one listening socket: ``python -m gpuplatform.webserve``.

daphne is one process, so it serves on one CPU at a time (the GIL), and a platform's
websockets cannot move to gunicorn (the ``api`` benchmark compares them). This launcher binds
the address itself, then starts ``--workers`` daphne processes that each accept from that one
socket (daphne's ``--fd``, as a process manager such as systemd or circus hands a socket over),
so the kernel spreads connections across them. daphne adopts IPv4 sockets only:
an IPv6 address is served by one daphne process that binds it itself. Live events reach every
process through the PostgreSQL channel layer, and each process borrows its database
connections from its own pool (``DB_POOL_SIZE`` each).

With one worker it execs daphne on the socket it bound, so one worker is one process. With
several, it imports nothing of Django (the daphne processes do). On SIGTERM or SIGINT it sends
them SIGTERM and exits once they have stopped; if one of them exits on its own it stops the others
and exits with that status, so ``make run`` stops and says so rather than serving on fewer.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

GRACE_S = 20.0  # how long the processes get to finish what they serve before they are killed


def listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(1024)
    return sock


def daphne_argv(python: str, sock: socket.socket, application: str) -> list[str]:
    return [python, "-m", "daphne", "--fd", str(sock.fileno()), application]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuplatform.webserve", description=__doc__)
    parser.add_argument("-b", "--bind", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("-p", "--port", type=int, default=8000)
    parser.add_argument("-w", "--workers", type=int, default=2, help="daphne processes")
    parser.add_argument("application", nargs="?", default="gpuplatform.asgi:application")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers: must be at least 1")
    try:
        sock = listen(args.bind, args.port)
    except OSError as exc:
        print(f"cannot listen on {args.bind}:{args.port}: {exc}", file=sys.stderr, flush=True)
        return 1
    if sock.family != socket.AF_INET:
        # daphne's fd: endpoint adopts IPv4 sockets only: one process binds the address itself.
        sock.close()
        print(f"{args.bind} is not an IPv4 address: serving with one daphne process",
              file=sys.stderr, flush=True)  # fmt: skip
        bind = [sys.executable, "-m", "daphne", "-b", args.bind, "-p", str(args.port)]
        os.execv(sys.executable, [*bind, args.application])  # noqa: S606 - fixed argv
    command = daphne_argv(sys.executable, sock, args.application)
    if args.workers == 1:
        # Nothing to spread: daphne itself takes this process's place on the socket, so one
        # worker is one process (a launcher waiting beside it would cost a process for nothing).
        os.set_inheritable(sock.fileno(), True)
        os.execv(sys.executable, command)  # noqa: S606 - fixed argv
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    procs = [subprocess.Popen(command, pass_fds=[sock.fileno()]) for _ in range(args.workers)]  # noqa: S603 - fixed argv
    sock.close()  # theirs now: they accept from it
    code = 0
    while not stopping:
        ended = [proc for proc in procs if proc.poll() is not None]
        if ended:
            code = ended[0].returncode or 1
            print(f"daphne (pid {ended[0].pid}) exited with status {ended[0].returncode}: "
                  "stopping the others", file=sys.stderr, flush=True)  # fmt: skip
            break
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
