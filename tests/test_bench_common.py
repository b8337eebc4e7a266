"""What the benchmarks share (bench/common.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.live import ROOT

# In a fresh interpreter: this one may have frozen objects already (gpuplatform.asgi settles
# the collector when it is imported), which the helper leaves frozen.
CHECK = """
import gc
from bench.common import as_a_web_process
from gpuplatform import gctune

threshold = gc.get_threshold()
assert gc.get_freeze_count() == 0
with as_a_web_process():
    assert gc.get_threshold()[0] == gctune.YOUNG_THRESHOLD, gc.get_threshold()
    assert gc.get_freeze_count() > 0
assert gc.get_threshold() == threshold, gc.get_threshold()
assert gc.get_freeze_count() == 0, gc.get_freeze_count()
print("ok")
"""


def test_in_process_timings_collect_garbage_as_a_web_process_and_set_it_back():
    result = subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
