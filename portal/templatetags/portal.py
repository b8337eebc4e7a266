"""Durations and runtimes in the page's language ("1 h 5 min", "1小时5分钟")."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.translation import gettext as _

register = template.Library()


@register.filter
def duration(value) -> str:
    """Seconds (or a timedelta) as the two largest units."""
    if value is None or value == "":
        return "—"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else value)
    days, rest = divmod(max(seconds, 0), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return _("%(d)d d %(h)d h") % {"d": days, "h": hours}
    if hours:
        return _("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    if minutes:
        return _("%(m)d min %(s)d s") % {"m": minutes, "s": secs}
    return _("%(s)d s") % {"s": secs}


@register.filter
def runtime(task) -> str:
    """How long the task has run (so far, or in all)."""
    started: datetime | None = task.started_at
    if started is None:
        return "—"
    return duration(((task.finished_at or timezone.now()) - started).total_seconds())


@register.filter
def mib(value) -> str:
    """MiB as GiB once it is big enough."""
    if value is None:
        return "—"
    value = float(value)
    if value >= 1024:
        return _("%(n)s GiB") % {"n": f"{value / 1024:.1f}".rstrip("0").rstrip(".")}
    return _("%(n)s MiB") % {"n": f"{value:.0f}"}
