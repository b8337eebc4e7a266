"""Start the platform's processes together for `make run`, and stop them together.

Written here rather than using honcho: honcho gives processes 5 s after SIGTERM before it
SIGKILLs them, too little for a scheduler finishing a pass, and lets a terminal's Ctrl-C
reach every child at once. Here each child runs in its own session (a Ctrl-C reaches only this
runner), gets SIGTERM, and has STOP_GRACE seconds to finish before SIGKILL.
"""

from __future__ import annotations

import ipaddress
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request

STOP_GRACE = float(os.environ.get("STOP_GRACE", "30"))
TTY = sys.stdout.isatty()
COLOURS = ["\033[36m", "\033[33m", "\033[35m", "\033[32m"] if TTY else [""]
RESET = "\033[0m" if TTY else ""


def trusted_proxies() -> str:
    """TRUSTED_PROXIES as gunicorn wants it (networks written without host bits)."""
    networks = [item.strip() for item in os.environ.get("TRUSTED_PROXIES", "").split(",")]
    return ",".join(str(ipaddress.ip_network(n, strict=False)) for n in networks if n)


def web_command(python: str, host: str, port: str) -> list[str]:
    """WEB_WORKERS daphne processes (ASGI: HTTP and websockets) on one socket
    (gpuplatform.webserve; one by default, which a workstation's few users keep far from busy,
    and which is then the one process webserve becomes); WEB_SERVER=gunicorn serves HTTP only,
    with WEB_WORKERS sync workers. Since daphne runs each request's Django work in one hop to a
    thread (gpuplatform.asgi_handler), it costs about what gunicorn does per request, and it
    serves websockets too; bench/bench_api.py measures both (and gunicorn's gthread workers) in one
    run.

    Forwarded headers are believed only from TRUSTED_PROXIES, and Django decides that
    (gpuplatform.middleware.TrustedProxyMiddleware), for both servers. daphne therefore never
    gets --proxy-headers: with it daphne takes X-Forwarded-For/-Proto from whoever connects (it
    has no list of trusted peers) and hides the real peer Django must check. gunicorn applies
    X-Forwarded-Proto itself, so it is told the same proxies (none when TRUSTED_PROXIES is
    empty, instead of its default of trusting loopback)."""
    workers = os.environ.get("WEB_WORKERS", "1")
    if os.environ.get("WEB_SERVER", "daphne") == "gunicorn":
        return [
            python,
            "-m",
            "gunicorn",
            "-b",
            f"{host}:{port}",
            "-w",
            workers,
            "--forwarded-allow-ips",
            trusted_proxies(),
            "--access-logfile",
            "-",
            "gpuplatform.wsgi:application",
        ]
    return [python, "-m", "gpuplatform.webserve", "-b", host, "-p", port, "-w", workers]


def commands(python: str, host: str, port: str) -> dict[str, list[str]]:
    return {
        "web": web_command(python, host, port),
        "scheduler": [python, "manage.py", "scheduler"],
        "agent": [python, "manage.py", "node_agent"],
    }  # fmt: skip


class Relay:
    """A child's output, copied to ours a whole line at a time, each line under its label.

    Reads the pipe with os.read, not through a buffered file's readline: readline takes every
    line the pipe holds into the file's buffer and returns one, and select() no longer sees the
    rest, which then waited for the child's next output (the node agent's start-up lines,
    "spawner ready" among them, showed only when the platform stopped)."""

    def __init__(self, fd: int, label: str, out=None) -> None:
        self.fd, self.label, self.out = fd, label, out or sys.stdout
        self.partial = b""

    def relay(self) -> bool:
        """Copy what the pipe holds now; False once the child has closed it."""
        chunk = os.read(self.fd, 65536)
        data, self.partial = self.partial + chunk, b""
        if chunk:  # the last piece waits for its newline
            *lines, self.partial = data.split(b"\n")
        else:  # closed: what is left is a last line without one
            lines = [data] if data else []
        if lines:
            self.out.write(
                "".join(f"{self.label}{line.decode(errors='replace')}\n" for line in lines)
            )
            self.out.flush()
        return bool(chunk)


def wait_until_up(url: str, procs: dict[str, subprocess.Popen], seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in procs.values()):
            return False
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - our own loopback URL
                return True
        except OSError:
            time.sleep(0.3)
    return False


def stop(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for name, proc in procs.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{name} did not stop within {STOP_GRACE:.0f} s: killing it", flush=True)
            proc.kill()
            proc.wait()


def main() -> int:
    host = os.environ.get("HOST", "127.0.0.1")
    port = os.environ.get("PORT", "8000")
    procs: dict[str, subprocess.Popen] = {}
    sel = selectors.DefaultSelector()
    width = max(len(name) for name in commands("", host, port))
    for i, (name, argv) in enumerate(commands(sys.executable, host, port).items()):
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        procs[name] = proc
        label = f"{COLOURS[i % len(COLOURS)]}{name:<{width}} |{RESET} "
        sel.register(proc.stdout, selectors.EVENT_READ, Relay(proc.stdout.fileno(), label))

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    base = f"http://{host}:{port}"
    if wait_until_up(f"{base}/healthz", procs):
        print(
            f"\ngpuplatform is up on {base}/\n"
            f"  portal {base}/portal/   (sign in at {base}/accounts/login/)\n"
            f"  admin  {base}/admin/\n"
            f"  API    {base}/api/v1/   (docs {base}/api/v1/docs/)\n  Ctrl-C stops everything.\n",
            flush=True,
        )
    exit_code = 0
    while not stopping:
        for key, _ in sel.select(timeout=0.5):
            if not key.data.relay():
                sel.unregister(key.fileobj)
        for name, proc in procs.items():
            if proc.poll() is not None and not stopping:
                print(f"{name} exited with status {proc.returncode}: stopping the rest", flush=True)
                stopping, exit_code = True, 1
    print("stopping web, scheduler and node agent...", flush=True)
    stop(procs)
    for key in list(sel.get_map().values()):
        while key.data.relay():
            pass
    print("stopped.", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
