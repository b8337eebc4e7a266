"""``manage.py gpu_fault``: an operator's way to make a simulated GPU misbehave."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from scheduling.models import Node
from telemetry.models import SimulatedFault


def test_it_queues_a_fault_for_the_node_agent(workstation):
    out = io.StringIO()
    call_command("gpu_fault", "workstation-1", "2", "xid", "79", stdout=out)

    fault = SimulatedFault.objects.get()
    assert (fault.gpu.index, fault.kind, fault.value, fault.applied_at) == (2, "xid", 79, None)
    assert "applied at the node agent's next sample" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("workstation-1", "9", "lost"), "no GPU 9 on node 'workstation-1'"),
        (("workstation-1", "0", "temperature"), "a temperature fault needs a value"),
    ],
)
def test_it_refuses_what_it_cannot_do(workstation, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("gpu_fault", *args)
    assert not SimulatedFault.objects.exists()


def test_it_refuses_to_fake_a_real_gpu(workstation):
    Node.objects.filter(pk=workstation.pk).update(backend="nvml")
    with pytest.raises(CommandError, match="runs real GPUs"):
        call_command("gpu_fault", "workstation-1", "0", "lost")
