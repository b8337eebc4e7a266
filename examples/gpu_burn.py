#!/usr/bin/env python3
"""A small GPU-burn style load for gpuplatform tasks: keeps every GPU it was given busy.

With PyTorch and CUDA it runs half-precision matrix multiplications on every visible device
(``cuda:0`` .. ``cuda:N-1``, i.e. the GPUs the platform put in ``CUDA_VISIBLE_DEVICES``), one
thread per device, and prints each device's TFLOP/s once a second. Without torch, without CUDA,
or when it was given no GPU (``CUDA_VISIBLE_DEVICES`` set but empty), it runs the same loop on
the CPU with numpy, or with pure Python when numpy is missing, and says so and why.

    python3 gpu_burn.py --seconds 10
    python3 gpu_burn.py --seconds 30 --fail-with 3      # exits 3 at the end: retry demos
    python3 gpu_burn.py --lr 0.01 --batch-size 64       # stand-in trainer for sweeps

Exit status: 0, or N with ``--fail-with N``; 143 on SIGTERM (130 on Ctrl-C) after printing
"stopping"; 1 when a device fails; 2 for bad arguments or a backend that is not available.
Standard library only, plus torch or numpy when they are installed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_SIZE = {"cuda": 8192, "numpy": 1024, "python": 48}
MIN_STEP_S = 0.05  # each worker makes its batches at least this long, so counting costs nothing
MAX_BATCH = 4096


@dataclass
class Device:
    """One thing to burn: ``step(k)`` runs k multiplications, waits for them, returns FLOPs."""

    label: str
    step: Callable[[int], float]
    flops: float = 0.0
    error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Keep the GPUs this task was given busy with matmuls and print TFLOP/s."
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to run (default 10)")
    parser.add_argument(
        "--fail-with",
        type=int,
        default=0,
        metavar="N",
        help="exit with status N at the end (for retry demos); default 0",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "cuda", "numpy", "python"),
        default="auto",
        help="auto (default): cuda if torch sees a GPU, else numpy, else pure Python",
    )
    parser.add_argument(
        "--size",
        type=int,
        default=0,
        help="matrix size n (default: 8192 on CUDA, 1024 with numpy, 48 in pure Python)",
    )
    # A stand-in trainer's hyperparameters: printed, so a sweep's tasks show what they ran with.
    parser.add_argument("--lr", help="learning rate (stand-in: only printed)")
    parser.add_argument("--batch-size", help="batch size (stand-in: only printed)")
    args = parser.parse_args(argv)
    if args.seconds < 0:
        parser.error("--seconds must not be negative")
    if not 0 <= args.fail_with <= 255:
        parser.error("--fail-with must be 0-255")
    if args.size < 0:
        parser.error("--size must be positive")
    return args


def print_environment() -> None:
    for name in ("GPUPLATFORM_TASK_ID", "GPUPLATFORM_ATTEMPT", "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        print(f"{name}={'(unset)' if value is None else value}")
    gpus = os.environ.get("GPUPLATFORM_GPUS")
    if gpus is not None:
        print(f"GPUPLATFORM_GPUS={gpus}")


# --- backends: each returns the devices, or raises Unavailable with the reason ---------------


class Unavailable(Exception):
    pass


def cuda_devices(size: int) -> list[Device]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        # Checked before importing torch (slow): an empty list means "no GPU for you".
        raise Unavailable("CUDA_VISIBLE_DEVICES is empty: this task was given no GPU")
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise Unavailable(
            f"torch {torch.__version__} sees no CUDA device (no driver, or a CPU-only build)"
        )
    uuids = [part.strip() for part in (visible or "").split(",") if part.strip()]
    devices = []
    for index in range(torch.cuda.device_count()):
        device = torch.device("cuda", index)
        major, _ = torch.cuda.get_device_capability(index)
        dtype = torch.bfloat16 if major >= 8 else torch.float16
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        out = torch.empty(size, size, device=device, dtype=dtype)

        def step(k: int, a=a, b=b, out=out, device=device) -> float:
            for _ in range(k):
                torch.matmul(a, b, out=out)
            torch.cuda.synchronize(device)
            return 2.0 * size**3 * k

        name = torch.cuda.get_device_name(index)
        where = f" = {uuids[index]}" if index < len(uuids) else ""
        devices.append(Device(f"cuda:{index} ({name}{where})", step))
    return devices


def numpy_devices(size: int) -> list[Device]:
    try:
        import numpy as np
    except ImportError:
        raise Unavailable("numpy is not installed") from None
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)

    def step(k: int) -> float:
        for _ in range(k):
            np.matmul(a, b, out=out)
        return 2.0 * size**3 * k

    return [Device("cpu (numpy float32)", step)]


def python_devices(size: int) -> list[Device]:
    a = [[float((i * size + j) % 7) for j in range(size)] for i in range(size)]
    b_columns = [[float((i + 2 * j) % 5) for i in range(size)] for j in range(size)]

    def step(k: int) -> float:
        for _ in range(k):
            [[sum(x * y for x, y in zip(row, col, strict=True)) for col in b_columns] for row in a]
        return 2.0 * size**3 * k

    return [Device("cpu (pure Python)", step)]


BACKENDS = {"cuda": cuda_devices, "numpy": numpy_devices, "python": python_devices}


def choose_backend(name: str, size: int) -> tuple[str, list[Device]]:
    if name != "auto":
        devices = BACKENDS[name](size or DEFAULT_SIZE[name])
        if name != "cuda":
            print(f"running on the CPU ({name}): asked for with --backend {name}")
        return name, devices
    reasons = []
    for candidate in ("cuda", "numpy", "python"):
        try:
            devices = BACKENDS[candidate](size or DEFAULT_SIZE[candidate])
        except Unavailable as exc:
            reasons.append(str(exc))
            continue
        if candidate != "cuda":
            print(f"running on the CPU ({candidate}): {'; '.join(reasons)}")
        return candidate, devices
    raise AssertionError("the pure Python backend is always available")


# --- the burn ---------------------------------------------------------------------------------


def burn(device: Device, stop: threading.Event) -> None:
    batch = 1
    try:
        while not stop.is_set():
            started = time.monotonic()
            flops = device.step(batch)
            with device.lock:
                device.flops += flops
            if time.monotonic() - started < MIN_STEP_S and batch < MAX_BATCH:
                batch *= 2
    except Exception as exc:  # a device that fails (out of memory, Xid) ends the run
        device.error = f"{type(exc).__name__}: {exc}"
        stop.set()


def tflops(flops: float, seconds: float) -> str:
    return f"{flops / max(seconds, 1e-9) / 1e12:.4g}"


def main(argv: list[str] | None = None) -> int:
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.stdout.reconfigure(line_buffering=True)  # a task's output goes to a file, not a tty

    args = parse_args(argv)
    print_environment()
    if args.lr is not None or args.batch_size is not None:
        print(f"stand-in trainer: lr={args.lr} batch_size={args.batch_size}")
    try:
        backend, devices = choose_backend(args.backend, args.size)
    except Unavailable as exc:
        print(f"gpu_burn: backend {args.backend} is not available: {exc}", file=sys.stderr)
        return 2
    print(f"burning {len(devices)} device(s) with {backend} for {args.seconds:g} s:")
    for device in devices:
        print(f"  {device.label}")

    workers = [
        threading.Thread(target=burn, args=(device, stop), daemon=True, name=device.label)
        for device in devices
    ]
    started = time.monotonic()
    deadline = started + args.seconds
    for worker in workers:
        worker.start()
    last_time, last_flops = started, [0.0] * len(devices)
    tick = 1
    while not stop.is_set():
        now = time.monotonic()
        if now >= deadline:
            break
        stop.wait(min(started + tick, deadline) - now)
        now = time.monotonic()
        if now < started + tick or stop.is_set():
            continue
        totals = [device.flops for device in devices]
        rates = [
            f"{device.label.split(' ')[0]} {tflops(total - last, now - last_time)} TFLOP/s"
            for device, total, last in zip(devices, totals, last_flops, strict=True)
        ]
        print(f"[{now - started:5.1f}s] " + " | ".join(rates))
        last_time, last_flops, tick = now, totals, tick + 1

    if signals:
        print("stopping")
    stop.set()
    for worker in workers:
        worker.join(timeout=10)
    elapsed = time.monotonic() - started
    for device in devices:
        print(f"{device.label}: {tflops(device.flops, elapsed)} TFLOP/s on average")
    if signals:
        return 128 + signals[0]
    errors = [f"{device.label}: {device.error}" for device in devices if device.error]
    if errors:
        print("gpu_burn: a device failed:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    if args.fail_with:
        print(f"exiting with {args.fail_with} as asked (--fail-with)")
    else:
        print("done")
    return args.fail_with


if __name__ == "__main__":
    sys.exit(main())
