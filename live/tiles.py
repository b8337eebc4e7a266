"""The GPU tiles of the dashboard, rendered in Python: hundreds of them through the template
engine took most of the first render's budget (a tile has thirty variable lookups);
format_html escapes the same for far less."""

from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _
from django.utils.translation import pgettext


def render_tiles(
    tiles: list[dict], *, simulated: bool, tasks_url: str, dash_url: str
) -> SafeString:
    labels = {
        "drain": _("drain"),
        "undrain": _("undrain"),
        "idle": _("idle"),
        "simulated": _("simulated"),
        # States as people read them (static/live/dashboard.js says the same when one changes).
        "available": pgettext("state", "available"),
        "draining": pgettext("state", "draining"),
        "offline": pgettext("state", "offline"),
        "failed": pgettext("state", "failed"),
        "in use": pgettext("state", "in use"),
    }
    return format_html_join(
        "\n", "{}", ((_tile(tile, simulated, tasks_url, dash_url, labels),) for tile in tiles)
    )


def _metric(value, unit: str) -> str:
    return "–" if value is None else f"{round(value)}{unit}"


def _tile(tile: dict, simulated: bool, tasks_url: str, dash_url: str, labels: dict) -> SafeString:
    gpu, sample = tile["gpu"], tile["sample"] or {}
    heat = sample.get("heat")
    holders = format_html_join(
        "<br>",
        '<a href="{}{}/change/">#{} {}</a> <span class="gp-tenant">{}</span>',
        (
            (tasks_url, h["task_id"], h["task_id"], _truncate(h["task__name"], 24),
             h["task__tenant__name"])
            for h in tile["holders"]
        ),
    ) or format_html('<span class="gp-idle">{}</span>', labels["idle"])  # fmt: skip
    return format_html(
        '<div class="gp-tile" id="gpu-{pk}" data-gpu-id="{pk}" data-state="{state}" '
        'data-memory-mb="{memory}"{sim} title="{model} {uuid}"{style}>'
        '<div class="gp-tile-head"><strong>GPU {index}</strong> '
        '<span class="gp-state">{label}</span></div>'
        '<div class="gp-type">{gpu_type}{sim_tag}</div>'
        '<div class="gp-metrics"><span data-metric="util">{util}</span>'
        '<span data-metric="mem">{mem}</span><span data-metric="temp">{temp}</span>'
        '<span data-metric="power">{power}</span></div>'
        '<div class="gp-holder">{holders}</div>'
        '<div class="gp-tile-actions">'
        '<a class="gp-act gp-drain" href="{dash}gpu/{pk}/drain/">{drain}</a> '
        '<a class="gp-act gp-undrain" href="{dash}gpu/{pk}/undrain/">{undrain}</a></div></div>',
        pk=gpu.pk,
        state=gpu.state,
        # An available GPU that a task holds is busy, not "available".
        label=labels.get(
            "in use" if tile["holders"] and gpu.state == "available" else gpu.state, gpu.state
        ),
        memory=gpu.memory_mb,
        sim=mark_safe(' data-simulated="1"') if simulated else "",  # noqa: S308 - a constant
        sim_tag=format_html(' <span class="gp-sim">· {}</span>', labels["simulated"])
        if simulated
        else "",
        model=gpu.model,
        uuid=gpu.uuid,
        style=format_html(' style="--gp-heat: hsl({} 65% 45%)"', heat) if heat is not None else "",
        index=gpu.index,
        gpu_type=gpu.gpu_type,
        util=_metric(sample.get("util"), "%"),
        mem=_metric(sample.get("mem_used_mb"), " MiB"),
        temp=_metric(sample.get("temp_c"), " °C"),
        power=_metric(sample.get("power_w"), " W"),
        holders=holders,
        dash=dash_url,
        drain=labels["drain"],
        undrain=labels["undrain"],
    )


def _truncate(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"
