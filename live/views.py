"""The operators' live dashboard: server-rendered like the admin, kept live by /ws/live/."""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth.decorators import user_passes_test
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods
from rest_framework import serializers

from gpuplatform import query
from live import history, selectors, tiles
from scheduling import controls, services
from scheduling import selectors as scheduling_selectors
from scheduling.models import GPU, Node

operator_required = user_passes_test(
    lambda user: user.is_active and user.is_staff, login_url=settings.LOGIN_URL
)

# The time-range picker's choices, in seconds (custom ranges give start and end).
RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
# The longest custom range: what the coarsest rollup still answers in a few hundred points.
MAX_RANGE_S = 90 * 86400


@operator_required
@require_GET
def dashboard(request: HttpRequest) -> HttpResponse:
    data = selectors.dashboard()
    tasks_url = reverse("admin:scheduling_task_changelist")
    for entry in data["nodes"]:
        entry["tiles"] = tiles.render_tiles(
            entry["gpus"],
            simulated=entry["node"].backend == "simulated",
            tasks_url=tasks_url,
            dash_url=reverse("live:dashboard"),
        )
    config = {
        "socket": "/ws/live/",
        "history": reverse("live:history"),
        "renderedAt": data["now"].timestamp(),
        "nodes": [
            {
                "id": entry["node"].pk,
                "name": entry["node"].name,
                "gpus": [{"id": t["gpu"].pk, "index": t["gpu"].index} for t in entry["gpus"]],
            }
            for entry in data["nodes"]
        ],
    }
    context = {
        **admin.site.each_context(request),
        **data,
        "title": _("Live operations"),
        "ranges": list(RANGES),
        "config": config,
    }
    return render(request, "live/dashboard.html", context)


class HistoryQuery(serializers.Serializer):
    node = serializers.PrimaryKeyRelatedField(
        queryset=Node.objects.all(), error_messages={
            "does_not_exist": gettext_lazy("expected the id of a node"),
            "incorrect_type": gettext_lazy("expected the id of a node"),
        },
    )  # fmt: skip
    range = serializers.ChoiceField(choices=list(RANGES), required=False)
    start = serializers.FloatField(min_value=0, max_value=1e11, required=False)
    end = serializers.FloatField(min_value=0, max_value=1e11, required=False)

    def validate(self, data: dict) -> dict:
        if "range" in data:
            data["end"] = time.time()
            data["start"] = data["end"] - RANGES[data["range"]]
            return data
        errors = {
            field: [_("expected seconds since the epoch")]
            for field in ("start", "end")
            if field not in data
        }
        if not errors and not 0 < data["end"] - data["start"] <= MAX_RANGE_S:
            errors["end"] = [_("expected after start, at most 90 days later")]
        if errors:
            raise serializers.ValidationError(errors)
        return data


@operator_required
@require_GET
def history_series(request: HttpRequest) -> JsonResponse:
    """A node's GPU series for the time-range picker: ``node`` and either ``range`` (one of
    RANGES) or ``start`` and ``end`` (epoch seconds)."""
    try:
        asked = query.parse(HistoryQuery, request.GET)
    except serializers.ValidationError as exc:
        return JsonResponse({"errors": query.problems(exc)}, status=400)
    node, start, end = asked["node"], asked["start"], asked["end"]
    series = history.series(node=node, start=start, end=end)
    return JsonResponse({"node": node.pk, "start": start, "end": end, **series})


ACTIONS = {
    ("gpu", "drain"): gettext_lazy(
        "Drain GPU %(name)s: running work finishes, nothing new starts."
    ),
    ("gpu", "undrain"): gettext_lazy("Return GPU %(name)s to service."),
    ("node", "drain"): gettext_lazy(
        "Drain node %(name)s: running work finishes, nothing new starts."
    ),
    ("node", "undrain"): gettext_lazy("Return node %(name)s to service."),
    ("task", "cancel"): gettext_lazy("Cancel task %(name)s (a running task is stopped)."),
    ("task", "requeue"): gettext_lazy(
        "Requeue task %(name)s (a running task is stopped and waits again)."
    ),
}


@operator_required
@require_http_methods(["GET", "POST"])
def act(request: HttpRequest, kind: str, pk: int, action: str) -> HttpResponse:
    """An operator's action, confirmed on a page of its own (GET asks, POST does)."""
    if (kind, action) not in ACTIONS:
        raise Http404
    if kind == "task":
        obj = scheduling_selectors.task_get_any(pk=pk)
    else:
        obj = get_object_or_404({"gpu": GPU, "node": Node}[kind], pk=pk)
    name = str(obj)
    if request.method == "GET":
        context = {
            **admin.site.each_context(request),
            "title": _("Are you sure?"),
            "question": str(ACTIONS[kind, action]) % {"name": name},
            "action": action,
        }
        return render(request, "live/confirm.html", context)
    done, refused = _perform(kind, action, obj, request.user)
    if refused:
        messages.error(request, _("%(name)s: not done: %(why)s") % {"name": name, "why": refused})
    else:
        if done:
            messages.success(
                request, _("%(name)s: %(action)s done.") % {"name": name, "action": action}
            )
        else:
            messages.warning(
                request, _("%(name)s: nothing to %(action)s.") % {"name": name, "action": action}
            )
    return redirect(reverse("live:dashboard"))


def _perform(kind: str, action: str, obj, user) -> tuple[bool, str]:
    """Whether the action changed something, and why it was refused ('' if it was not)."""
    if kind == "gpu":
        act = services.gpus_drain if action == "drain" else services.gpus_undrain
        return bool(act(gpus=[obj], actor=user)), ""
    if kind == "node":
        act = services.nodes_drain if action == "drain" else services.nodes_undrain
        return bool(act(nodes=[obj], actor=user)), ""
    result = controls.tasks_control(tasks=[obj], action=action, by=user)
    return bool(result.done), "; ".join(why for _task, why in result.refused)
