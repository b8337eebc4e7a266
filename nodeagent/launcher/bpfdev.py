"""An eBPF device program for a cgroup v2: which character devices its processes may open.

cgroup v2 has no devices controller; the kernel asks the ``BPF_PROG_TYPE_CGROUP_DEVICE``
programs attached to a process's cgroup instead (runc and systemd's ``DeviceAllow=`` do it this
way). The program here denies NVIDIA GPU nodes (char major 195, minors ``denied_from`` up to
``denied_to``) except the minors given, and allows every other device: the attempt's
``/dev/null``, ttys, ``nvidiactl``, ``nvidia-uvm`` and ``/dev/dri`` are left as they were.

Why ctypes and the ``bpf()`` system call rather than a library: what Python offers is bcc (compiles
C with clang at run time, and needs the kernel's headers on every node), or young bindings and
compilers on PyPI (``pylibbpf`` 0.0.x, ``pythonbpf``, ``bpf-asm``) that bring more than they save.
The program is a dozen fixed instructions, assembled below, and two commands load and attach it
(``BPF_PROG_LOAD``, ``BPF_PROG_ATTACH``); the attachment keeps it alive and it goes away with the
last cgroup it is attached to, or with the descriptor of the process that loaded it, which keeps a
few for its next attempts (``attach``). Root only (CAP_SYS_ADMIN or CAP_BPF).
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
from collections.abc import Iterable
from pathlib import Path

# From include/uapi/linux/bpf.h.
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
# Other programs may sit beside ours, on this cgroup or its parents, and every one must allow
# a device (systemd attaches its own the same way).
BPF_F_ALLOW_MULTI = 2
BPF_DEVCG_DEV_CHAR = 2
_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_ATTR_SIZE = 128  # more than the fields we set; the kernel wants the rest zero
_LOG_SIZE = 1 << 16


class BpfError(OSError):
    """The kernel refused to load or attach the program."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    """One ``struct bpf_insn``: opcode, registers (dst low nibble, src high), offset, immediate."""
    return struct.pack("<BBhi", code, dst | (src << 4), off, imm)


_LDX_W = 0x61  # dst = *(u32 *)(src + off)
_AND32_K = 0x54  # dst &= imm (32 bits)
_JNE_K, _JEQ_K, _JGT_K = 0x55, 0x15, 0x25  # if dst <op> imm: pc += off
_MOV64_K = 0xB7  # dst = imm
_EXIT = 0x95


def program(major: int, denied_from: int, denied_to: int, allowed: Iterable[int]) -> bytes:
    """The instructions: deny char ``major``:``denied_from``..``denied_to`` but ``allowed``.

    The context (r1) is ``struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor}``,
    with the device type in the low 16 bits of ``access_type``; returning 0 denies (EPERM).
    """
    checks: list[tuple[int, int]] = [(_JNE_K, BPF_DEVCG_DEV_CHAR), (_LDX_W, 4), (_JNE_K, major)]
    checks += [(_LDX_W, 8)]
    if denied_from > 0:
        checks.append((0xA5, denied_from))  # JLT: below the range, allowed
    checks.append((_JGT_K, denied_to))
    checks += [(_JEQ_K, minor) for minor in sorted(set(allowed))]
    code = [_insn(_LDX_W, 2, 1, 0), _insn(_AND32_K, 2, imm=0xFFFF)]
    allow_at = len(code) + len(checks) + 2  # after "r0 = 0; exit"
    for op, value in checks:
        if op == _LDX_W:
            code.append(_insn(_LDX_W, 2, 1, value))
        else:
            code.append(_insn(op, 2, off=allow_at - len(code) - 1, imm=value))
    code += [_insn(_MOV64_K, 0, imm=0), _insn(_EXIT)]
    code += [_insn(_MOV64_K, 0, imm=1), _insn(_EXIT)]
    return b"".join(code)


def _bpf(command: int, attr: bytes) -> int:
    number = _SYSCALL.get(platform.machine())
    if number is None:
        raise BpfError(0, f"bpf() is not known on {platform.machine()}")
    buffer = ctypes.create_string_buffer(attr, _ATTR_SIZE)
    libc = _libc()
    result = libc.syscall(number, command, buffer, _ATTR_SIZE)
    if result < 0:
        code = ctypes.get_errno()
        raise BpfError(code, os.strerror(code))
    return result


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def load(code: bytes) -> int:
    """Load a device program; its file descriptor. The verifier's log is in the error: it is
    asked for only when a load failed, and the load tried again for it (writing it cost each
    load as much as the rest of the verifier's work)."""
    try:
        return _load(code, explain=False)
    except BpfError:
        return _load(code, explain=True)


def _load(code: bytes, *, explain: bool) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")  # no helper is called: any licence would do
    log = ctypes.create_string_buffer(_LOG_SIZE) if explain else None
    attr = struct.pack(
        "<IIQQIIQ",
        BPF_PROG_TYPE_CGROUP_DEVICE,
        len(code) // 8,
        ctypes.addressof(insns),
        ctypes.addressof(license_),
        1 if explain else 0,  # log level 1: the verifier explains a refusal
        _LOG_SIZE if explain else 0,
        ctypes.addressof(log) if log is not None else 0,
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except BpfError as exc:
        said = log.value.decode(errors="replace") if log is not None else ""
        detail = said.strip().splitlines()[-3:]
        raise BpfError(exc.errno, f"cannot load the device program: {exc.strerror}"
                       + (f" ({'; '.join(detail)})" if detail else "")) from None  # fmt: skip


# Programs this process loaded, by their code, kept for its next attempts: a supervisor runs
# attempt after attempt, mostly on the same GPUs, and each load ran the verifier again. A
# program lives while a cgroup holds it or a descriptor refers to it; at most KEEP are held.
_LOADED: dict[bytes, int] = {}
KEEP = 8


def attach(cgroup: Path, code: bytes) -> None:
    """Attach a device program of ``code`` to the cgroup v2 directory ``cgroup``, loading it
    unless this process has it loaded already."""
    prog = _LOADED.pop(code, None)
    if prog is None:
        prog = load(code)
        while len(_LOADED) >= KEEP:
            os.close(_LOADED.pop(next(iter(_LOADED))))  # the least recently used
    _LOADED[code] = prog
    target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = struct.pack("<IIII", target, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)
        _bpf(BPF_PROG_ATTACH, attr)
    finally:
        os.close(target)


@functools.cache
def available() -> str | None:
    """None when this process can load device programs, else why not (cached)."""
    try:
        os.close(load(program(195, 0, 253, ())))
    except BpfError as exc:
        return exc.strerror or str(exc)
    except OSError as exc:  # no libc.syscall, seccomp, ...
        return str(exc)
    return None
