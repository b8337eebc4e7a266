"""Hosts as Linux network namespaces on one bridge: the network half of the many-host harness.

Each host is a namespace with one veth pair: ``eth0`` inside, with its own address on a private
10.x.y.0/24 picked at random per run, and the outer end on a bridge whose own address (``.1``)
is where the harness's PostgreSQL listens. Cutting a host's link sets the outer end down: its
packets go nowhere and no one is told (no RST, no FIN), as when a cable is pulled.

Everything this run created carries its run id in its name (bridge, veths, namespaces), so
``Network.remove`` removes what this run made and nothing else, even after a failure halfway.
"""

from __future__ import annotations

import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
import time

IP = shutil.which("ip") or "/usr/sbin/ip"


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([IP, *args], capture_output=True, text=True, check=check, timeout=30)  # noqa: S603


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a reason to skip), or None when they can."""
    if os.geteuid() != 0:
        return "the many-host harness needs root (network namespaces, a bridge, veth pairs)"
    if not os.path.exists(IP):
        return "the many-host harness needs iproute2's `ip` (not found)"
    probe = f"gpup-probe-{secrets.token_hex(3)}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` does not work here: {made.stderr.strip()}"
    try:  # a container may allow namespaces but not links (no CAP_NET_ADMIN on the host's)
        for argv in (("link", "add", f"gpupb{probe[-6:]}", "type", "bridge"),
                     ("link", "add", f"gpupv{probe[-6:]}", "type", "veth", "peer", "name",
                      "eth0", "netns", probe)):  # fmt: skip
            made = ip(*argv, check=False)
            if made.returncode != 0:
                return f"`ip {' '.join(argv[:4])}` does not work here: {made.stderr.strip()}"
    finally:
        ip("link", "delete", f"gpupb{probe[-6:]}", check=False)
        ip("link", "delete", f"gpupv{probe[-6:]}", check=False)
        ip("netns", "delete", probe, check=False)
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no route or address of this machine overlaps."""
    taken = []
    for line in ip("-4", "route", "show", "table", "all").stdout.splitlines():
        word = line.split()[0] if line.split() else ""
        if word[:1].isdigit():
            try:
                taken.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    for _ in range(200):
        subnet = ipaddress.ip_network(f"10.{random.randint(64, 250)}.{random.randint(0, 255)}.0/24")  # noqa: S311
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError("no free 10.x.y.0/24 subnet found")


class Network:
    """A bridge on a private subnet, and the namespaces joined to it."""

    def __init__(self) -> None:
        self.run = secrets.token_hex(2)
        self.subnet = free_subnet()
        self.bridge = f"gpub{self.run}"
        self.gateway = str(self.subnet.network_address + 1)  # the bridge's own address
        self.namespaces: dict[str, str] = {}  # host name -> namespace
        self.outer: dict[str, str] = {}  # host name -> the veth end on the bridge
        self.addresses: dict[str, str] = {}
        self.silenced: set[str] = set()

    def create(self) -> None:
        """The bridge, with its own address (``remove`` undoes it, even if this fails)."""
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_bridge_address(self) -> str:
        """One more address of the machine itself on the bridge (after the gateway's: ``.2``,
        ``.3``...), for a second server such as a standby; it goes with the bridge."""
        listed = ip("-o", "-4", "addr", "show", "dev", self.bridge).stdout
        address = str(self.subnet.network_address + 1 + listed.count(" inet "))
        ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", self.bridge)
        return address

    def add_host(self, name: str) -> str:
        """A namespace for host ``name`` with its link on the bridge; returns its address."""
        index = len(self.namespaces) + 1
        namespace = f"gpup-{self.run}-{name}"
        outer = f"gpuv{self.run}{index}"
        address = str(self.subnet.network_address + 10 + index)
        self.namespaces[name] = namespace
        ip("netns", "add", namespace)
        self.outer[name] = outer
        ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        ip("link", "set", outer, "master", self.bridge, "up")
        inside = ["netns", "exec", namespace, IP]
        ip(*inside, "link", "set", "lo", "up")
        ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip(*inside, "link", "set", "eth0", "up")
        self.addresses[name] = address
        return address

    def exec_prefix(self, name: str) -> list[str]:
        """The argv prefix that runs a command inside host ``name``."""
        return [IP, "netns", "exec", self.namespaces[name]]

    def silence(self, address: str) -> None:
        """Every host drops what it sends to ``address`` (a server of this machine on the
        bridge): that server's machine vanished without a word. Its connections get no reset
        and no answer, only their own timeouts end them. (A blackhole route in each host: the
        kernel here has no packet filter actions for tc, and no iptables is installed; a new
        connection to it is refused at once, which a real vanished machine would leave to
        ``connect_timeout``.)"""
        self.silenced.add(address)
        for namespace in self.namespaces.values():
            ip("netns", "exec", namespace, IP, "route", "add", "blackhole", f"{address}/32")

    def unsilence(self) -> None:
        """Undo every ``silence``."""
        for address in self.silenced:
            for namespace in self.namespaces.values():
                ip("netns", "exec", namespace, IP, "route", "del", "blackhole", f"{address}/32",
                   check=False)  # fmt: skip
        self.silenced.clear()

    def cut(self, name: str) -> None:
        """Pull host ``name``'s cable: nothing in or out, and nobody told."""
        ip("link", "set", self.outer[name], "down")

    def mend(self, name: str) -> None:
        """Plug the cable back in; returns once the link is up at both ends."""
        ip("link", "set", self.outer[name], "up")
        deadline = time.monotonic() + 10
        while "LOWER_UP" not in ip("-o", "link", "show", self.outer[name]).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"host {name}'s link did not come back up")
            time.sleep(0.05)

    def pids(self, name: str) -> list[int]:
        """Every process running inside host ``name``."""
        listed = ip("netns", "pids", self.namespaces[name], check=False).stdout.split()
        return [int(pid) for pid in listed if pid.isdigit()]

    def kill_all(self, name: str) -> None:
        """SIGKILL every process of host ``name``, until none is left: the host died."""
        for _ in range(50):
            pids = self.pids(name)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"processes of host {name} survive SIGKILL: {self.pids(name)}")

    def remove(self) -> None:
        """Kill every host's processes, then remove the namespaces, veths and bridge (each step
        tried whatever the previous one did)."""
        errors = []
        for name in list(self.namespaces):
            try:
                self.kill_all(name)
            except RuntimeError as exc:
                errors.append(str(exc))
        for name, namespace in self.namespaces.items():
            ip("link", "delete", self.outer[name], check=False)
            ip("netns", "delete", namespace, check=False)
        ip("link", "delete", self.bridge, check=False)
        if errors:
            raise RuntimeError("; ".join(errors))


def remove_run(run: str) -> None:
    """Remove what run ``run`` left: its hosts' processes, namespaces (their veths go with
    them) and bridge. For a run whose test process was killed outright, so that nothing of
    its own cleaning ran."""
    prefix = f"gpup-{run}-"
    for line in ip("netns", "list", check=False).stdout.splitlines():
        namespace = line.split()[0] if line.split() else ""
        if not namespace.startswith(prefix):
            continue
        for pid in ip("netns", "pids", namespace, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        ip("netns", "delete", namespace, check=False)
    ip("link", "delete", f"gpub{run}", check=False)
