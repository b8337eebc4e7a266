"""A pending task's reason as data (``scheduling.wait_reasons``): every wait the policy decides
becomes a reason of the catalogue whose English is the policy's text to the letter (what the
API has always said), and which reads in Chinese without English words."""

from __future__ import annotations

import re

from django.utils import translation

from scheduling import reasons
from scheduling.policy import ONLINE, Limits, PolicySettings, TenantView, schedule
from scheduling.wait_reasons import of_preemption, of_wait
from tests.scheduling.test_policy import NOW, gpus, running, snap, task

RECLAIM = PolicySettings().reclaim_after_s
# What a reason may show in Latin letters: names people gave (tenants, nodes, pools, queues,
# GPU types) and product words.
NAMES = {"vision", "capped", "pooled", "busy", "small", "node", "default", "rtx4090", "sft",
         "GPU", "GPUs", "GiB", "UTC"}  # fmt: skip


def decisions():
    """Decisions whose waits cover every kind a pass decides, with their variants."""
    cluster = gpus(nodes=2, per_node=2)
    yield schedule(snap(cluster, [
        task(gpus=8), task(gpus=8),  # capacity, then reserved (backfill)
        task(gpus=(3, 8)), task(gpus=1, gpu_memory_mb=40 * 1024),
        task(gpus=1, node="node-1", pool="default", gpu_memory_mb=30 * 1024),
        task(gpus=3, pool="default"), task(gpus=1, node="node-0", gpu_type="a100"),
        task(not_before=NOW + 30),
        task("capped"), task("pooled"), task("busy"), task("small"),
    ], tenants=[
        TenantView("capped", limits=Limits(gpus=0)),
        TenantView("pooled", limits=Limits(), pool_limits={"default": Limits(gpus=0)}),
        TenantView("busy", limits=Limits(running_tasks=0)),
        TenantView("small", limits=Limits(gpu_memory_mb=1024)),
    ]))  # fmt: skip
    busy = gpus(per_node=2)
    holder = running("vision", [busy[0]], queue="sft")
    yield schedule(snap(busy, [task(queue="sft"), task(queue="sft")], [holder]))
    queued = [task(queue="sft", gpus=4), task(queue="sft")]
    yield schedule(snap(busy, queued))
    victim = running("other", [busy[0], busy[1]], priority=10)
    yield schedule(snap(busy, [task(priority=90, gpus=2)], [victim]))
    online = [running("svc", [g], priority=90, task_class=ONLINE, preemptible=False,
                      started_at=NOW - 86400) for g in busy]  # fmt: skip
    yield schedule(snap(busy, [task(priority=10, submitted_at=NOW - 60)], online))


def test_every_wait_of_the_policy_is_a_reason_with_its_english_to_the_letter():
    codes = set()
    for decision in decisions():
        for why in decision.waits.values():
            reason = of_wait(why)
            assert reason.code != reasons.TEXT, why
            assert reason.text == why.text
            codes.add(reason.code)
            with translation.override("zh-hans"):
                chinese = reason.rendered
            english = [w for w in re.findall(r"[A-Za-z]{3,}", chinese) if w not in NAMES]
            assert english == [], (chinese, why.text)
    assert codes >= {"wait_capacity", "wait_reserved", "wait_quota_gpus", "wait_quota_memory",
                     "wait_quota_tasks", "wait_queue_runs", "wait_queue_behind", "wait_backoff",
                     "wait_preempting"}  # fmt: skip


def test_a_wait_it_cannot_say_stays_text_as_written():
    from scheduling.policy import Wait

    for why in (Wait("held", "held by olga: disk full"), Wait("other", "why not"),
                Wait("capacity", "needs something", {"gpus": 1})):  # fmt: skip
        assert of_wait(why) == reasons.of(why.text)


def test_the_place_in_line_reads_in_each_language():
    assert reasons.in_line("needs 1 x GPU; 0 idle now", 2, 5) == (
        "needs 1 x GPU; 0 idle now; 2nd of 5 in line"
    )
    assert [reasons.in_line("x", n, 20).split("; ")[1] for n in (1, 3, 11, 12, 13, 21)] == [
        "1st of 20 in line", "3rd of 20 in line", "11th of 20 in line", "12th of 20 in line",
        "13th of 20 in line", "21st of 20 in line",
    ]  # fmt: skip
    with translation.override("zh-hans"):
        assert reasons.in_line("需要", 2, 5) == "需要；排队第 2 位，共 5 位"


def test_a_preemption_is_a_reason_with_its_english_to_the_letter():
    busy = gpus(per_node=2)
    victim = running("other", [busy[0], busy[1]], priority=10)
    by_priority = schedule(snap(busy, [task(priority=90, gpus=2)], [victim])).preemptions
    cluster = gpus(per_node=4)
    services = [running("svc", [g], priority=90, task_class=ONLINE, preemptible=False,
                        started_at=NOW - 86400) for g in cluster]  # fmt: skip
    batch = task(priority=10, submitted_at=NOW - RECLAIM - 60)
    reclaimed = schedule(snap(cluster, [batch], services)).preemptions
    made = [(of_preemption(p), p) for p in [*by_priority, *reclaimed]]
    assert [reason.code for reason, _ in made] == ["preempted_for", "preempted_to_reclaim"]
    for reason, preemption in made:
        assert reason.text == preemption.reason
        with translation.override("zh-hans"):
            chinese = reason.rendered
        assert re.findall(r"[A-Za-z]{3,}", chinese) == [], chinese


def test_a_tasks_dependencies_are_listed_each_with_its_state_in_each_language():
    from scheduling.policy import Wait

    text = "waiting for prep-data (#3, running), 训练 (#4, timed_out)"
    reason = of_wait(Wait("dependencies", text))
    assert (reason.code, reason.text) == ("waiting_for_dependencies", text)
    with translation.override("zh-hans"):
        assert reason.rendered == "等待 prep-data（#3，运行中）、训练（#4，已超时）"
