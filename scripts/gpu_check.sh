#!/usr/bin/env bash
# Check gpuplatform against this host's real NVIDIA GPUs, end to end:
#   1. the NVML backend's real-GPU tests (discovery, per-process memory, sampling, XID events);
#   2. the platform as `make run` starts it (web, scheduler, node agent with GPU_BACKEND=nvml)
#      running two one-GPU CUDA tasks submitted through gpuctl: they must run one after the
#      other on a one-GPU host, see only their GPU, and leave telemetry for their GPU behind;
#   3. the device fence: a task opens only its own GPU's /dev/nvidia<minor> and nvidia-smi in it
#      lists only that GPU; a task with no GPU opens none.
# Run from the repository root in an installed checkout (`make setup`), or with PYTHON naming an
# interpreter that has requirements-dev.txt. TASK_PYTHON: the interpreter the CUDA tasks run
# with, as the tenant's user (default: /usr/bin/python3); with PyTorch they compute, without it
# they hold GPU memory through libcuda. Uses DATABASE_URL, else the embedded PostgreSQL, and
# runs the tasks as the demo tenant (`manage.py bootstrap`; a day's token of its own). Stop
# `make run` first: a node has one spawner and one relay. Prints what it sees; exits non-zero
# on a failure.
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
# Absolute (tasks start in their own workdir) and runnable by the tenant's user: the system's.
TASK_PY=${TASK_PYTHON:-/usr/bin/python3}
[ -x "$TASK_PY" ] || TASK_PY=$(command -v python3)
PORT=${PORT:-8765}
export SECRET_KEY_FILE=${SECRET_KEY_FILE:-var/secret_key} GPU_BACKEND=${GPU_BACKEND:-nvml}
export HOST=127.0.0.1 PORT
export STOP_GRACE=10 PYTHONUNBUFFERED=1
mkdir -p var
[ -s "$SECRET_KEY_FILE" ] || "$PY" -c 'import secrets; print(secrets.token_urlsafe(50))' \
    > "$SECRET_KEY_FILE"

step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T.%N | cut -c1-12)"; }

step nvidia-smi
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv || true

step "NVML backend tests on the real GPUs"
status=0
"$PY" -m pytest -m gpu -v -s -p no:cacheprovider \
    tests/nodeagent/test_inventory_nvml.py tests/nodeagent/test_inventory_nvml_sampling.py ||
    status=$?

step "database and demo tenant"
"$PY" manage.py migrate --noinput -v 0
"$PY" manage.py createcachetable
"$PY" manage.py bootstrap >/dev/null  # the demo tenant (alice), where it is not there yet
token=$("$PY" manage.py issue_token alice demo --name gpu-check --days 1)
"$PY" manage.py node_agent --once

step "platform up (web, scheduler, node agent on NVML)"
"$PY" scripts/run.py > var/gpu_check_platform.log 2>&1 &
platform=$!
trap 'kill -TERM $platform 2>/dev/null; wait $platform; tail -40 var/gpu_check_platform.log' EXIT
READY='import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)'
for _ in $(seq 120); do
    "$PY" -c "$READY" "http://$HOST:$PORT/readyz" 2>/dev/null && break
    sleep 0.5
done
# The web answers before the node is ready to launch: wait for its spawner too, so that
# "submitted -> running" below measures the platform, not its start-up.
for _ in $(seq 120); do
    grep -q "spawner ready" var/gpu_check_platform.log && break
    sleep 0.5
done
export GPUCTL_URL=http://$HOST:$PORT GPUCTL_TOKEN=$token
gpuctl() { "$PY" -c 'import sys; from gpuctl.cli import main; sys.exit(main())' "$@"; }
gpuctl get gpus -o wide

# Each task names its GPU and uses it for about 8 s: with PyTorch, fills 3 GiB and multiplies
# matrices; without it, holds 2 GiB through the driver's own library (libcuda, as
# tests/nodeagent/test_inventory_nvml.py does), so the check needs nothing but a driver.
CUDA_TASK='
import ctypes, os, time
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"), "user", os.getuid())
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    print("devices", torch.cuda.device_count(), torch.cuda.get_device_name(0))
    x = torch.randn(16384, 16384, device="cuda")
    end, n = time.time() + 8, 0
    while time.time() < end:
        y = x @ x
        torch.cuda.synchronize()
        n += 1
    print("matmuls", n, "memory GiB", round(torch.cuda.max_memory_allocated() / 2**30, 1))
else:
    cuda = ctypes.CDLL("libcuda.so.1")
    count, dev, ctx, ptr = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    name = ctypes.create_string_buffer(128)
    assert cuda.cuInit(0) == 0, "cuInit failed"
    assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDeviceGetName(name, 128, dev) == 0
    print("devices", count.value, name.value.decode())
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 30)) == 0, "cannot allocate 2 GiB"
    print("holding 2 GiB for 8 s (no PyTorch in this interpreter: no matmuls)")
    time.sleep(8)
'
step "two one-GPU CUDA tasks"
first=$(gpuctl -o json run --name cuda-1 --gpus 1 -- "$TASK_PY" -u -c "$CUDA_TASK" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
second=$(gpuctl -o json run --name cuda-2 --gpus 1 -- "$TASK_PY" -u -c "$CUDA_TASK" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
sleep 8  # the first task has imported PyTorch and holds its GPU by now
gpuctl get tasks -o wide
gpuctl top --once 2>/dev/null || gpuctl get gpus -o wide
nvidia-smi --query-compute-apps=pid,used_memory --format=csv || true
gpuctl describe task "$second"
gpuctl wait "$first" "$second" || status=$?
for task in "$first" "$second"; do
    step "task $task"
    gpuctl describe task "$task"
    gpuctl logs "$task"
    gpuctl metrics "$task" || true
done
# The device fence: a task opens only its own GPUs' /dev/nvidia<minor> (EPERM for the others,
# while nvidiactl stays open), and nvidia-smi inside it lists only its GPU; a task with no GPU
# opens none and nvidia-smi lists none.
FENCE_TASK='
import errno, glob, json, os, re, subprocess
found = {"nodes": {}}
for path in sorted(glob.glob("/dev/nvidia[0-9]*")) + ["/dev/nvidiactl"]:
    try:
        os.close(os.open(path, os.O_RDWR))
        found["nodes"][path] = "opened"
    except OSError as exc:
        found["nodes"][path] = errno.errorcode.get(exc.errno, str(exc.errno))
smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
found["smi"] = re.findall(r"UUID: (GPU-[0-9a-f-]+)", smi.stdout)
found["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES", "")
print("FENCE", json.dumps(found))
'
step "GPU device fence (one GPU, then none)"
fenced=$(gpuctl -o json run --name fence-1 --gpus 1 -- "$TASK_PY" -u -c "$FENCE_TASK" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
unfenced=$(gpuctl -o json run --name fence-0 --gpus 0 -- "$TASK_PY" -u -c "$FENCE_TASK" |
    "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
gpuctl wait "$fenced" "$unfenced" || status=$?
for task in "$fenced" "$unfenced"; do
    gpuctl logs "$task" | tee "var/gpu_check_fence_$task.log"
done
"$PY" manage.py shell -c "
import json
from scheduling.models import Node
print('isolation:', '; '.join(Node.objects.values_list('isolation', flat=True)))
for task, gpus in (($fenced, 1), ($unfenced, 0)):
    line = next(l for l in open(f'var/gpu_check_fence_{task}.log') if l.startswith('FENCE '))
    found = json.loads(line[6:])
    held = [u for u in found['visible'].split(',') if u]
    opened = [p for p, what in found['nodes'].items() if what == 'opened' and p[-1].isdigit()]
    refused = [p for p, what in found['nodes'].items() if what == 'EPERM']
    ok = (len(held) == gpus and found['smi'] == held and len(opened) == gpus
          and len(opened) + len(refused) == len(found['nodes']) - 1
          and found['nodes'].get('/dev/nvidiactl') == 'opened')
    print('task', task, 'holds', held, 'nvidia-smi lists', found['smi'], 'opened', opened,
          'refused', refused, 'OK' if ok else 'FAILED: the fence does not hold')
    if not ok:
        raise SystemExit(1)
" || status=$?

step "what the platform recorded"
"$PY" manage.py shell -c "
first, second = $first, $second
"'
from scheduling.models import TaskAttempt
from telemetry.models import GpuSample
for a in TaskAttempt.objects.filter(task__in=[first, second]).select_related("task"):
    t = a.task
    print(t.id, t.name, t.state, "gpus", a.gpu_uuids, "submitted", t.submitted_at,
          "started", a.started_at, "ended", a.ended_at, "exit", a.exit_code, a.outcome)
one, two = (TaskAttempt.objects.select_related("task").get(task=t) for t in (first, second))
ms = lambda a, b: round((b - a).total_seconds() * 1000)
print("submitted -> running:", ms(one.task.submitted_at, one.started_at), "ms (first task)")
if two.started_at >= one.ended_at:  # one GPU: the second waited for the first
    print("first ended -> second running:", ms(one.ended_at, two.started_at), "ms")
samples = GpuSample.objects.filter(at__gte=one.started_at).order_by("at")
print("GPU samples", samples.count(), "max utilisation %",
      max((s.util_gpu or 0 for s in samples), default=None), "max memory MiB",
      max((s.memory_used_mb or 0 for s in samples), default=None))
'
exit $status
