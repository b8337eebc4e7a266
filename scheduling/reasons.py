"""Why a task is where it is, as data: a code and parameters, rendered in the reader's language.

A task's reason and each of its ``TaskEvent``'s are stored three ways: ``reason``, the English
text (what API clients, logs and searches have always read), and ``reason_code`` with
``reason_params``, from which every page, the API and gpuctl render it in the language of whoever
reads it (``render``). The catalogue below holds one English template per code, marked for
translation; its Chinese is in ``locale/zh_Hans/LC_MESSAGES/django.po``.

A reason may end with notes (``params["notes"]``: more reasons, joined with "; "), and a
parameter may itself be a reason (``{"code": ..., "params": ...}``): "requeued: node a stopped
heartbeating". Text that has no code (what a node agent says about an attempt's limits or lost
output, a dependency's or a hold's wait) is kept as a ``text`` reason and shown as it was
written. Why a pending task waits and why a pass preempts one are made reasons from the
policy's data by ``scheduling.wait_reasons``. A row written before the codes existed has no
code: it renders as its stored text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils.translation import get_language, gettext, pgettext
from django.utils.translation import gettext_noop as _n

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

TEXT = "text"  # no code: the text as written, in whatever language it was written

TEMPLATES: dict[str, str] = {
    TEXT: "%(text)s",
    # Submission
    "submitted": _n("submitted"),
    "submitted_for": _n("submitted by %(by)s for %(owner)s"),
    "waiting_for_scheduler": _n("submitted; waiting for the scheduler"),
    # Placement and start
    "placed": _n("placed on %(node)s (GPU %(gpus)s)"),
    "started": _n("started on %(node)s (pid %(pid)s)"),
    "started_seen_at_end": _n("started (seen at its end)"),
    # Ends
    "exited": _n("exited with %(exit_code)s"),
    "timed_out": _n("timed out after %(seconds)s s"),
    "retry": _n("retry %(failure)s of %(retries)s in %(delay)s s"),
    "cancelled": _n("cancelled"),
    "cancelled_by": _n("cancelled by %(by)s"),
    "stopping": _n("stopping"),
    "preempted": _n("preempted"),
    "requeued_after_preemption": _n("requeued after preemption"),
    "requeued": _n("requeued"),
    # People's controls
    "paused": _n("paused"),
    "paused_by": _n("paused by %(by)s"),
    "resumed": _n("resumed"),
    "resumed_by": _n("resumed by %(by)s"),
    "released": _n("released"),
    "released_by": _n("released by %(by)s"),
    "retried": _n("retried"),
    "retried_by": _n("retried by %(by)s"),
    "requeued_by": _n("requeued by %(by)s"),
    "priority": _n("priority %(old)s -> %(new)s"),
    "priority_by": _n("priority %(old)s -> %(new)s by %(by)s"),
    # Services (the spec's service block): what the health check last said, while it runs
    "service_starting": _n("running on %(node)s, port %(port)s; starting: %(check)s"),
    "service_healthy": _n("running on %(node)s, port %(port)s; healthy: %(check)s"),
    "service_unhealthy": _n(
        "running on %(node)s, port %(port)s; unhealthy (%(failures)s of %(limit)s failed checks "
        "in a row): %(check)s"
    ),
    "service_restarted": _n("stopped as unhealthy: %(detail)s"),
    # Infrastructure
    "lost_requeued": _n("requeued: %(reason)s"),
    "held_after_requeues": _n("held after %(requeues)s infrastructure requeues; last: %(reason)s"),
    "node_silent": _n("node %(node)s stopped heartbeating"),
    "node_fenced": _n("node %(node)s lost the database for %(seconds)s s: the attempt was stopped"),
    "gpu_broken": _n("GPU %(gpu)s became %(state)s during the attempt (exit %(exit_code)s)"),
    # Why a pending task waits, as a scheduling pass decided (``scheduling.wait_reasons``)
    "in_line": _n("%(ordinal)s of %(line)s in line"),
    "ordinal_st": _n("%(n)sst"),
    "ordinal_nd": _n("%(n)snd"),
    "ordinal_rd": _n("%(n)srd"),
    "ordinal_th": _n("%(n)sth"),
    "wait_queue_runs": _n("queue %(queue)s: #%(behind)s runs first"),
    "wait_queue_behind": _n("queue %(queue)s: waiting behind #%(behind)s"),
    "wait_backoff": _n("retry backoff until %(at)s"),
    "wait_capacity": _n("needs %(what)s%(where)s; %(fitting)s"),
    "what_gpus": _n("%(gpus)s x %(kind)s"),
    "what_gpu_range": _n("%(gpus)s-%(gpus_max)s x %(kind)s"),
    "what_shared": _n("%(gpus)s x %(kind)s with %(memory)s free"),
    "where_node": _n(" on node %(node)s"),
    "where_one_node": _n(" on one node"),
    "where_pool": _n(" in pool %(pool)s"),
    "where_node_pool": _n(" on node %(node)s in pool %(pool)s"),
    "where_one_node_pool": _n(" on one node in pool %(pool)s"),
    "fitting_idle": _n("%(count)s idle now"),
    "fitting_memory": _n("%(count)s with enough memory now"),
    "wait_reserved": _n("%(needs)s; next to start: GPUs on %(node)s are held for it, %(eta)s"),
    "eta_at": _n("expected by %(at)s"),
    "eta_unknown": _n("when they free up"),
    # Rows stored before 2026-11-29 also carry "used" (what the tenant used then): unused.
    "wait_quota_gpus": _n("%(scope)s has no room left in its quota of %(limit)s GPUs"),
    "wait_quota_memory": _n("%(scope)s has no room left in its quota of %(limit)s GPU memory"),
    "wait_quota_tasks": _n("%(scope)s has no room left in its quota of %(limit)s running tasks"),
    "scope_tenant": _n("tenant %(tenant)s"),
    "scope_tenant_pool": _n("tenant %(tenant)s in pool %(pool)s"),
    "wait_preempting": _n("waiting for %(count)s preempted task(s) to stop on %(node)s"),
    "reclaim": _n(
        "%(task_class)s holds %(holds)s of its guaranteed %(guarantee)s GPUs: takes borrowed "
        "GPUs back from %(at)s"
    ),
    "preempted_for": _n("preempted for #%(task)s (%(task_class)s, priority %(priority)s)"),
    "preempted_to_reclaim": _n(
        "preempted for #%(task)s (%(task_class)s, priority %(priority)s): %(reclaimed)s holds "
        "more than its guaranteed share"
    ),
    "waiting_for_dependencies": _n("waiting for %(tasks)s"),
    "dependency": _n("%(name)s (#%(id)s, %(state)s)"),
    **{
        f"state_{state}": label
        for state, label in (
            ("pending", _n("pending")),
            ("scheduled", _n("scheduled")),
            ("running", _n("running")),
            ("paused", _n("paused")),
            ("preempted", _n("preempted")),
            ("lost", _n("lost")),
            ("succeeded", _n("succeeded")),
            ("failed", _n("failed")),
            ("cancelled", _n("cancelled")),
            ("timed_out", _n("timed_out")),
        )
    },  # fmt: skip
    "supervisor_gone_before_start": _n(
        "supervisor of attempt %(attempt)s on %(node)s is gone before it reported a start: the "
        "launch never came up"
    ),
    "supervisor_gone": _n(
        "supervisor of attempt %(attempt)s on %(node)s is gone (killed, or it crashed) without "
        "recording how the task ended: the task's output pipe went with it, so the task was "
        "stopped instead of adopted"
    ),
    "gpu_memory_overuse": _n(
        "task #%(task)s uses %(used_mb)s MiB of GPU memory on %(gpu)s, reserved %(reserved_mb)s MiB"
    ),
    "idle_reclaimed": _n(
        "reclaimed: GPU %(gpu)s of %(node)s stayed at or under %(threshold)s %% utilisation for "
        "%(minutes)s min (idle GPU policy)"
    ),
    # What a node agent says of an attempt's end (``scheduling.agent_notes``)
    "out_of_memory": _n("killed by the kernel: out of memory (over resources.memory)"),
    "exited_after_limit": _n("exited with %(exit_code)s after it %(hit)s"),
    "limit_pids": _n("hit the process limit (resources.pids: %(pids)s; %(refused)s forks refused)"),
    "limit_cpus": _n(
        "held back by the CPU limit (resources.cpus: %(cpus)s; throttled in %(throttled)s of "
        "%(periods)s periods)"
    ),
    "output_not_kept": _n("output not kept: %(why)s (%(dropped)s bytes dropped)"),
    "output_removed": _n("output not kept: %(why)s"),
    "output_incomplete": _n("output may be incomplete: %(why)s"),
    "log_full": _n("the log disk is full"),
    "log_full_quota": _n("the log disk is full (quota)"),
    "log_read_only": _n("the log disk is read-only"),
    "log_refused": _n("the log directory refuses writes"),
    "log_gone": _n("the log directory is gone"),
    "log_removed": _n("the log was removed while the task ran"),
    "log_error": _n("the log cannot be written (%(error)s)"),
    # A GPU's state (translated, as everywhere, with the context "state": ``CONTEXTS``)
    **{f"gpu_state_{state}": state for state in ("available", "draining", "offline", "failed")},
    "class_batch": _n("batch"),
    "class_online": _n("online"),
}


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason as data. ``text`` is its English, as stored in ``reason``; ``rendered`` its
    text in the active language."""

    code: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.code not in TEMPLATES:
            raise ValueError(f"reason code: {self.code!r} is not in the catalogue")
        try:
            TEMPLATES[self.code] % {name: "" for name in self.params}
        except KeyError as exc:
            raise ValueError(f"reason {self.code}: parameter {exc} missing") from None

    @property
    def text(self) -> str:
        return render(self.code, self.params, translate=False)

    @property
    def rendered(self) -> str:
        return render(self.code, self.params)

    def noted(self, *notes: Reason | str) -> Reason:
        """This reason with notes at its end (empty ones left out)."""
        more = [of(note).as_data() for note in notes if note]
        if not more:
            return self
        return Reason(self.code, {**self.params, "notes": [*self.params.get("notes", ()), *more]})

    def without_notes(self) -> Reason:
        return Reason(self.code, {k: v for k, v in self.params.items() if k != "notes"})

    def as_data(self) -> dict[str, Any]:
        return {"code": self.code, "params": self.params}


def of(reason: Reason | str) -> Reason:
    """A reason as data; plain text becomes a ``text`` reason."""
    return reason if isinstance(reason, Reason) else Reason(TEXT, {"text": reason})


def by(code: str, who: AbstractBaseUser | None) -> Reason:
    """``code`` ("cancelled"), or ``code_by`` with the user's name when someone did it."""
    if who is None:
        return Reason(code)
    return Reason(f"{code}_by", {"by": who.get_username()})


def stored(reason: Reason | str) -> tuple[str, str, dict[str, Any]]:
    """What a row stores of ``reason``: (English text, code, params). Plain text has no code, as
    rows written before the codes existed."""
    if isinstance(reason, Reason):
        return reason.text, reason.code, reason.params
    return reason, "", {}


# Reasons rendered, by (language, code, params as JSON, fallback): a page or a listing of
# waiting tasks renders the same few reasons (a tenant's quota, a shape that does not fit), and
# each is a dozen catalogue lookups, which were most of the API's task listing's CPU (the
# ``api`` bench's GET). Emptied when full.
_RENDERED: dict[tuple, str] = {}
_RENDERED_MAX = 4096


def render(
    code: str, params: Mapping[str, Any] | None, fallback: str = "", *, translate: bool = True
) -> str:
    """The reason ``code`` with ``params`` in the active language (English with
    ``translate=False``); ``fallback`` (the stored text) when there is no code or it cannot be
    rendered (an unknown code, a parameter missing)."""
    if (code or "") not in TEMPLATES:
        return fallback
    try:
        key = (get_language() if translate else None, code, json.dumps(params, sort_keys=True),
               fallback)  # fmt: skip
    except (TypeError, ValueError):  # not JSON: as it came, uncached
        return _render(code, params, fallback, translate)
    text = _RENDERED.get(key)
    if text is None:
        if len(_RENDERED) >= _RENDERED_MAX:
            _RENDERED.clear()
        text = _RENDERED[key] = _render(code, params, fallback, translate)
    return text


def _render(code: str, params: Mapping[str, Any] | None, fallback: str, translate: bool) -> str:
    template = TEMPLATES[code]
    params = params or {}
    values = {name: _value(value, translate) for name, value in params.items() if name != "notes"}
    try:
        text = (_translated(code, template) if translate and code != TEXT else template) % values
    except (KeyError, TypeError, ValueError):
        return fallback
    notes = [_value(note, translate) for note in params.get("notes") or ()]
    # Translators: what joins the parts of a reason ("exited with 0; output not kept").
    separator = pgettext("reason parts", "; ") if translate else "; "
    return separator.join([text, *(note for note in notes if note)])


# Codes whose template is translated in a context of the catalogue (pgettext), as the same
# words are elsewhere.
CONTEXTS = {
    f"gpu_state_{state}": "state" for state in ("available", "draining", "offline", "failed")
}


def _translated(code: str, template: str) -> str:
    context = CONTEXTS.get(code)
    return pgettext(context, template) if context else gettext(template)


def in_line(text: str, position: int, line: int, *, language: str | None = None) -> str:
    """A pending task's reason (``text``, in the active language) with its place in line;
    ``language``: the active one, where the caller knows it (a listing's rows)."""
    # As render("in_line", ...) says it, from the templates looked up once per language and
    # ordinal: every waiting task of a listing has a place of its own.
    language = get_language() if language is None else language
    separator, place, ordinal = _in_line_templates(language, _suffix(position))
    return f"{text}{separator}{place % {'ordinal': ordinal % {'n': position}, 'line': line}}"


_IN_LINE: dict[tuple, tuple[str, str, str]] = {}


def _in_line_templates(language: str | None, suffix: str) -> tuple[str, str, str]:
    """(what joins the parts of a reason, the "in line" template, the ordinal's), translated
    into the active language, which is ``language``."""
    templates = _IN_LINE.get((language, suffix))
    if templates is None:
        templates = _IN_LINE[(language, suffix)] = (
            # Translators: what joins the parts of a reason ("exited with 0; output not kept").
            pgettext("reason parts", "; "),
            _translated("in_line", TEMPLATES["in_line"]),
            _translated(f"ordinal_{suffix}", TEMPLATES[f"ordinal_{suffix}"]),
        )
    return templates


def _suffix(n: int) -> str:
    """The English ordinal's suffix of ``n`` (1st, 2nd, 3rd, 11th): one code each, so that
    each language says its ordinals its own way."""
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _value(value: Any, translate: bool) -> Any:
    """A parameter as it goes into its template: a reason in it rendered, a list of reasons
    rendered and listed."""
    if isinstance(value, Mapping) and "code" in value:
        if value["code"] not in TEMPLATES:
            return value.get("text", "")
        return _render(value["code"], value.get("params"), value.get("text", ""), translate)
    if isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        # Translators: what separates the items of a list in a reason ("a (#1), b (#2)").
        separator = pgettext("reason list", ", ") if translate else ", "
        return separator.join(str(_value(item, translate)) for item in value)
    return value
