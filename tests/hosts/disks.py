"""A disk of its own for each host of the many-host harness: a mount namespace per host.

The machine's filesystem is shared, so a path one host writes (a task's log under its var
directory) would be readable by every other host, and a feature that forgets to carry data
between hosts would pass its tests. Each host therefore has a persistent mount namespace (a
file under ``mountns/``, entered with ``nsenter``) in which the estate's ``hosts/`` directory
is a tmpfs holding only that host's own directory (bound from the real one, which the test
process sees whole). Propagation is ``slave``: mounts made later on the machine (namespaces
that ``ip netns`` adds) still reach the host, and nothing mounted inside leaks out.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)  # noqa: S603


def unmount_under(root: Path) -> None:
    """Unmount everything mounted at or under ``root`` in this mount namespace, deepest first
    (lazily: a host's processes may still be going away)."""
    points = []
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            point = line.split()[4]
            if point == str(root) or point.startswith(f"{root}/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)  # noqa: S607


class Disks:
    """The hosts' mount namespaces, for the estate in ``root`` whose hosts' directories are
    ``root/hosts/<name>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hosts_dir = root / "hosts"
        self.namespaces = root / "mountns"
        self.stash = root / "stash"
        for path in (self.hosts_dir, self.namespaces, self.stash):
            path.mkdir(exist_ok=True)
        # A namespace file may only be bound under a private mount.
        run("mount", "--bind", str(self.namespaces), str(self.namespaces))
        run("mount", "--make-private", str(self.namespaces))

    def add(self, name: str) -> None:
        """Host ``name``'s namespace: ``hosts/`` holds only ``hosts/<name>``."""
        own = self.hosts_dir / name
        handle = self.namespaces / name
        handle.touch()
        script = (
            f"mount --bind '{own}' '{self.stash}' && "
            f"mount -t tmpfs -o mode=755 gpup-disk '{self.hosts_dir}' && mkdir '{own}' && "
            f"mount --bind '{self.stash}' '{own}' && umount '{self.stash}'"
        )
        run(UNSHARE, f"--mount={handle}", "--propagation", "slave", "sh", "-c", script)

    def prefix(self, name: str, workdir: Path) -> list[str]:
        """The argv prefix that runs a command with host ``name``'s disk, in ``workdir``
        (entering a mount namespace starts at ``/``)."""
        return [NSENTER, f"--mount={self.namespaces / name}", f"--wd={workdir}", "--"]

    def remove(self) -> None:
        unmount_under(self.root)
