"""A service's port is held in the database: never two attempts not ended on one node with the
same port, whichever process picks it; a port is given again once its attempt has ended."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from scheduling.agentapi.serving import PortTaken, claim_port
from scheduling.models import TaskAttempt
from tests.factories import NodeFactory, TaskFactory


def attempt(node, **fields) -> TaskAttempt:
    return TaskAttempt.objects.create(task=TaskFactory(), number=1, node=node, **fields)


def free(port: int) -> bool:
    return True


@pytest.fixture
def node(db):
    return NodeFactory(name="workstation-1")


def test_the_database_refuses_a_second_attempt_on_a_port_held_on_its_node(node):
    attempt(node, service_port=20000)
    attempt(NodeFactory(name="workstation-2"), service_port=20000)  # another node: its own
    with pytest.raises(IntegrityError), transaction.atomic():
        attempt(node, service_port=20000)
    attempt(node, service_port=20000, outcome="failed")  # ended: holds nothing


def test_auto_takes_a_port_no_running_attempt_holds_and_then_runs_out(node, settings):
    settings.SERVICE_PORT_RANGE = (20000, 20001)
    first, second, third = attempt(node), attempt(node), attempt(node)
    ports = [claim_port(attempt_id=a.pk, node=node.name, wanted="auto", free=free)
             for a in (first, second)]  # fmt: skip
    assert sorted(ports) == [20000, 20001]
    with pytest.raises(PortTaken, match="no free port in SERVICE_PORTS 20000-20001 on node"):
        claim_port(attempt_id=third.pk, node=node.name, wanted="auto", free=free)
    TaskAttempt.objects.filter(pk=first.pk).update(outcome="succeeded")
    assert claim_port(attempt_id=third.pk, node=node.name, wanted="auto", free=free) == ports[0]


def test_auto_skips_a_port_something_else_listens_on(node, settings):
    settings.SERVICE_PORT_RANGE = (20000, 20002)
    port = claim_port(
        attempt_id=attempt(node).pk, node=node.name, wanted="auto", free=lambda p: p == 20001
    )
    assert port == 20001


def test_a_fixed_port_held_or_in_use_is_refused_with_the_reason(node):
    claim_port(attempt_id=attempt(node).pk, node=node.name, wanted=8100, free=free)
    with pytest.raises(
        PortTaken, match="port 8100 is in use on node workstation-1 by another task"
    ):
        claim_port(attempt_id=attempt(node).pk, node=node.name, wanted=8100, free=free)
    with pytest.raises(PortTaken, match="port 8200 is in use .* by another program"):
        claim_port(attempt_id=attempt(node).pk, node=node.name, wanted=8200, free=lambda p: False)
