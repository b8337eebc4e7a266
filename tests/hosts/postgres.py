"""A private PostgreSQL cluster for the many-host harness, listening on the bridge's address.

The machine's own server listens on 127.0.0.1 with trust authentication, which no other
namespace can reach. Rather than forward a port to it, the harness runs a cluster of its own
from the system's binaries (/usr/lib/postgresql/<version>/bin, the version CI has): the hosts
then reach the database over the bridge, each from its own address (``pg_stat_activity``'s
``client_addr`` tells the hosts apart), with scram-sha-256 passwords, and a cut link leaves
the server holding half-open connections exactly as a real partition does, which a forwarder
in between would hide. It runs as the ``postgres`` user (initdb refuses root), without fsync
(a test cluster, thrown away), and is removed with its data when the run ends.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import psycopg

PORT = 5432


def binaries() -> Path | None:
    """The newest PostgreSQL server binaries installed on this machine, if any."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def unavailable() -> str | None:
    if binaries() is None:
        return (
            "the many-host harness needs PostgreSQL's server binaries (/usr/lib/postgresql/*/bin)"
        )
    if shutil.which("runuser") is None:
        return "the many-host harness needs util-linux's `runuser` to run PostgreSQL as postgres"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "the many-host harness needs the `postgres` system user to run its own cluster"
    return None


class PrivatePostgres:
    """initdb, start and stop a throwaway cluster in ``root`` listening on ``address``."""

    def __init__(self, root: Path, address: str, port: int = PORT) -> None:
        self.bin = binaries()
        self.root = root
        self.address = address
        self.port = port
        self.data = root / "pgdata"
        self.log_file = root / "postgres.log"
        self.password = secrets.token_urlsafe(16)
        self.process: subprocess.Popen | None = None
        owner = pwd.getpwnam("postgres")
        self.sockets = root / "pgsockets"
        for path in (self.data, self.sockets):
            path.mkdir(mode=0o700)
            os.chown(path, owner.pw_uid, owner.pw_gid)
        pwfile = root / "pgpass"
        pwfile.write_text(self.password + "\n")
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        self._as_postgres(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--no-sync",
            "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}",
        )  # fmt: skip
        pwfile.unlink()
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {address}/24 scram-sha-256\n")
            # a standby on the bridge (StandbyPostgres) streams from this one
            hba.write(f"host replication postgres {address}/24 scram-sha-256\n")
        self.options: list[str] = []  # more ``-c name=value`` for the server

    def _as_postgres(self, *argv: str) -> None:
        done = subprocess.run(  # noqa: S603 - fixed argv
            ["runuser", "-u", "postgres", "--", *argv],
            capture_output=True, timeout=120, cwd=self.root, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed:\n{done.stderr.decode()}")

    def url(self, database: str = "gpuplatform") -> str:
        return f"postgres://postgres:{self.password}@{self.address}:{self.port}/{database}"

    def start(self) -> None:
        log = open(self.log_file, "ab")  # noqa: SIM115 - kept for the server's life
        self.process = subprocess.Popen(  # noqa: S603 - fixed argv
            ["runuser", "-u", "postgres", "--", str(self.bin / "postgres"), "-D", str(self.data),
             "-c", f"listen_addresses={self.address}", "-p", str(self.port),
             "-c", f"unix_socket_directories={self.sockets}", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=300", *self.options],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2, autocommit=True):
                    return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "the harness's PostgreSQL did not start:\n"
                        + self.log_file.read_text(errors="replace")
                    ) from None
                time.sleep(0.2)

    def create_database(self, name: str = "gpuplatform") -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def _signal_server(self, signum: int) -> list[psutil.Process]:
        """``signum`` to the postmaster and every process it forked (runuser's process group
        does not hold them); returns them."""
        try:
            postmaster = psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))
            processes = [postmaster, *postmaster.children(recursive=True)]
        except (OSError, ValueError, IndexError, psutil.Error):
            return []
        for process in processes:
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass
        return processes

    def freeze(self) -> None:
        """The server stops answering, its sockets still open (SIGSTOP to every process)."""
        self._signal_server(signal.SIGSTOP)

    def kill(self) -> None:
        """The server dies: SIGKILL to the postmaster and every backend at once (its clients'
        connections are reset by the kernel, as when its machine is still reachable). Returns
        once they are gone: a backend still exiting holds the shared memory a new server on
        the same data refuses to start beside ("pre-existing shared memory block is still in
        use"; seen once, after a freeze)."""
        killed = self._signal_server(signal.SIGKILL)
        if self.process is not None:
            # runuser stops itself when its child stops (``freeze``): it must go on to reap it.
            self.process.send_signal(signal.SIGCONT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        _, alive = psutil.wait_procs(killed, timeout=30)
        if alive:
            raise RuntimeError(f"the harness's PostgreSQL outlived SIGKILL: {alive}")

    def stop(self) -> None:
        """Stop the server (fast shutdown, then SIGKILL) and remove its data."""
        if self.process is not None and self.process.poll() is None:
            try:  # SIGINT to the postmaster: a fast shutdown, which ends every session
                os.kill(int((self.data / "postmaster.pid").read_text().split()[0]), signal.SIGINT)
            except (OSError, ValueError, IndexError):
                pass
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.data, ignore_errors=True)


class StandbyPostgres(PrivatePostgres):
    """A streaming standby of ``primary`` (``pg_basebackup -R``: its data, and how to follow
    it), listening on ``address``; ``promote`` makes it a primary (``pg_ctl promote``)."""

    def __init__(self, primary: PrivatePostgres, address: str, name: str = "standby") -> None:
        self.bin = primary.bin
        self.root = primary.root
        self.address = address
        self.port = primary.port
        self.password = primary.password
        self.process = None
        self.data = self.root / f"pgdata-{name}"
        self.log_file = self.root / f"postgres-{name}.log"
        self.sockets = self.root / f"pgsockets-{name}"
        owner = pwd.getpwnam("postgres")
        for path in (self.data, self.sockets):  # an earlier test's standby's, if any
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(mode=0o700)
            os.chown(path, owner.pw_uid, owner.pw_gid)
        source = (
            f"host={primary.address} port={primary.port} user=postgres password={primary.password} "
            f"application_name={name}"
        )
        self._as_postgres(
            str(self.bin / "pg_basebackup"), "-D", str(self.data), "-d", source, "-R",
            "--wal-method=stream", "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        # Not the primary's synchronous_standby_names (copied with its data): a promoted
        # standby with none of its own must not wait for one.
        self.options = ["-c", "synchronous_standby_names="]

    def promote(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "promote", "-w", "-D", str(self.data))
