"""The tenant portal's pages. Reads go through the tenant-scoped selectors, writes through the
services the API calls, role checks through ``tenants.roles`` (as the API's): a viewer who posts
anyway gets 403, another tenant's task is a 404."""

from __future__ import annotations

import csv
import functools
from datetime import timedelta

import yaml
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST
from rest_framework import serializers

from gpuplatform import query
from gpuplatform.query import BIGINT_MAX, INT_MAX, WholeNumber
from monitoring import selectors as alert_selectors
from portal.controls import controls_for
from portal.forms import (
    MemberForm,
    NotebookForm,
    TaskForm,
    ThrottledLoginForm,
    TokenForm,
    YamlForm,
    offer_choices,
    yaml_example,
)
from scheduling import controls, logs, selectors, serviceurl
from scheduling import usage as tenant_usage
from scheduling.spec import SpecError, parse_yaml
from scheduling.states import TaskState
from scheduling.submission import tasks_submit
from telemetry import selectors as telemetry_selectors
from tenants import access
from tenants import selectors as tenant_selectors
from tenants import services as tenant_services
from tenants.models import Role
from tenants.roles import Action

PAGE_SIZE = 50
USAGE_DAYS = (7, 30, 90)


# --- Signing in and landing -----------------------------------------------------------------------


def landing(request: HttpRequest) -> HttpResponse:
    """Operators to the live dashboard, members to the portal, anyone else to the sign-in
    page."""
    if not request.user.is_authenticated:
        return redirect("login")
    if request.user.is_staff:
        return redirect("live:dashboard")
    return redirect("portal:overview")


class LoginView(auth_views.LoginView):
    form_class = ThrottledLoginForm
    template_name = "portal/login.html"
    redirect_authenticated_user = True

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if getattr(form, "throttled", False):
            response.status_code = 429
        return response


# --- Every page -----------------------------------------------------------------------------------


def portal_page(view):
    """Signed in, and a member of some active tenant: ``request.caller`` is set."""

    @functools.wraps(view)
    @login_required
    def wrapper(request: HttpRequest, *args, **kwargs):
        who = access.caller_for(request)
        if who is None or who.tenant is None:
            # A member somewhere who named another tenant (?tenant=) is told which.
            context = {"problem": who.problem, "named": bool(who.memberships)} if who else {}
            return render(request, "portal/no_tenant.html", context, status=403)
        request.caller = who
        try:
            return view(request, *args, **kwargs)
        except serializers.ValidationError as exc:
            # A query parameter the page cannot read (gpuplatform.query): say which, and why.
            context = {"title": _("Bad request"), "problems": query.problems(exc)}
            return render(request, "portal/bad_query.html", context, status=400)

    return wrapper


@require_POST
@portal_page
def switch_tenant(request: HttpRequest) -> HttpResponse:
    if not access.pick(request, request.POST.get("tenant", "")):
        raise Http404
    return redirect("portal:overview")


# --- Overview -------------------------------------------------------------------------------------


def _bar(used: float, limit: float | None) -> dict:
    percent = None if not limit else min(100, round(100 * used / limit))
    return {"used": used, "limit": limit, "percent": percent}


@portal_page
def overview(request: HttpRequest) -> HttpResponse:
    who = request.caller
    tenant = who.tenant
    context = {
        "title": _("Overview"),
        "active": "overview",
        "tasks": selectors.tasks_active(tenant=tenant, owner_id=who.user_id),
        "free_gpus": selectors.gpus_free_by_type(),
        "alerts": alert_selectors.alerts_open_for_tasks(tenant=tenant, owner_id=who.user_id),
    }
    # The role matrix (tenants/roles.py) shows the quota and fair share to tenant admins only.
    if who.may(Action.VIEW_QUOTA):
        context.update(_quota_bars(tenant))
    return render(request, "portal/overview.html", context)


def _quota_bars(tenant) -> dict:
    use = tenant_usage.quota_in_use(tenant=tenant)
    quotas = tenant_selectors.quota_limits(tenant=tenant)
    cluster = next((q for q in quotas if q.pool_id is None), None)
    bars = [
        (_("GPUs"), _bar(use["gpus"], cluster and cluster.max_gpus), ""),
        (
            _("GPU memory"),
            _bar(use["gpu_memory_mb"], cluster and cluster.max_gpu_memory_mb),
            "MiB",
        ),
        (_("Running tasks"), _bar(use["running_tasks"], cluster and cluster.max_running_tasks), ""),
        (_("Queued tasks"), _bar(use["queued_tasks"], cluster and cluster.max_queued_tasks), ""),
    ]
    return {"bars": bars, "fair_share": tenant_usage.fair_share(tenant=tenant, quotas=quotas)}


# --- Tasks ----------------------------------------------------------------------------------------


class TaskListQuery(serializers.Serializer):
    """The task list's filters, sort and cursor (``after``: the last row's sort key, as the
    page's own "next" link writes it)."""

    state = serializers.ListField(
        child=serializers.ChoiceField(choices=[s.value for s in TaskState]), default=list
    )
    queue = serializers.CharField(default="")
    owner = serializers.ChoiceField(choices=["me"], default="")
    q = serializers.CharField(default="")
    sort = serializers.ChoiceField(choices=list(selectors.TASK_SORTS), default="newest")
    after = serializers.CharField(default="")

    def validate(self, data: dict) -> dict:
        raw = data["after"]
        data["after"] = None
        if raw:
            parts = raw.split(".")
            whole = all(p.isascii() and p.isdigit() and int(p) <= BIGINT_MAX for p in parts)
            if not whole or len(parts) != len(selectors.TASK_SORTS[data["sort"]]):
                raise serializers.ValidationError(
                    {"after": [_("not a place in this list, got %(value)r") % {"value": raw}]}
                )
            data["after"] = tuple(int(p) for p in parts)
        return data


@portal_page
def task_list(request: HttpRequest) -> HttpResponse:
    who = request.caller
    if request.method == "POST":
        return _bulk_cancel(request)
    params = request.GET
    known = [s.value for s in TaskState]
    asked = query.parse(TaskListQuery, params)
    chosen_states, sort, owner = asked["state"], asked["sort"], asked["owner"]
    tasks, next_cursor = selectors.task_page(
        tenant=who.tenant,
        states=chosen_states,
        queue=asked["queue"],
        owner_id=who.user_id if owner == "me" else None,
        name=asked["q"][:200],
        sort=sort,
        after=asked["after"],
        limit=PAGE_SIZE,
    )
    following = params.copy()
    following.pop("after", None)
    next_query = None
    if next_cursor is not None:
        following["after"] = ".".join(str(part) for part in next_cursor)
        next_query = following.urlencode()
    return render(
        request,
        "portal/tasks.html",
        {
            "title": _("Tasks"),
            "active": "tasks",
            "tasks": tasks,
            "states": known,
            "chosen_states": chosen_states,
            "sort": sort,
            "sorts": [("newest", _("newest first")), ("oldest", _("oldest first")),
                      ("priority", _("highest priority first"))],
            "owner": owner,
            "queue": params.get("queue", ""),
            "q": params.get("q", ""),
            "next_query": next_query,
            "first_page": "after" in params,
            "may_control": who.may(Action.CONTROL_TASK),
        },
    )  # fmt: skip


def _bulk_cancel(request: HttpRequest) -> HttpResponse:
    who = request.caller
    who.require(Action.CONTROL_TASK)
    # Ticked boxes of the page's own rows: anything else is no task of the list.
    given = request.POST.getlist("task")[:PAGE_SIZE]
    ids = [int(i) for i in given if i.isascii() and i.isdigit() and int(i) <= BIGINT_MAX]
    tasks = selectors.task_list(tenant=who.tenant).filter(pk__in=ids).order_by("pk")
    refused = sorted(set(ids) - {task.pk for task in tasks})  # gone, or not ours
    allowed = [task for task in tasks if who.may(Action.CONTROL_TASK, task)]
    refused += [task.pk for task in tasks if task not in allowed]
    result = controls.tasks_control(tasks=allowed, action="cancel", by=request.user)
    refused += [task.pk for task, _why in result.refused]
    if result.done:
        messages.success(request, _("Cancelled %(n)d task(s).") % {"n": len(result.done)})
    if refused:
        messages.warning(
            request,
            _("Not cancelled: %(ids)s (ended already, or not yours).")
            % {"ids": ", ".join(f"#{pk}" for pk in sorted(refused))},
        )
    return redirect(request.get_full_path())


def _hint(task) -> str:
    """What change would start a pending task, from the last pass's assessment."""
    code = (task.wait or {}).get("code", "")
    hints = {
        "queue": _("It starts when the tasks before it in queue %(queue)s have ended."),
        "held": _("It is held after repeated infrastructure failures: press Retry to release it."),
        "dependencies": _("It starts once the tasks it runs after have succeeded."),
        "backoff": _("It starts again when its retry backoff ends."),
        "quota": _(
            "Your tenant's quota is in use: it starts when your running tasks end, or when an "
            "operator raises the quota."
        ),
        "capacity": _(
            "No GPUs that fit it are free: it starts when some free up. Asking for fewer GPUs, "
            "less GPU memory or another GPU type may start it sooner."
        ),
        "reserved": _("It is first in line: the next GPUs that fit it are held for it."),
        "preempting": _("Tasks are being stopped to make room: it starts when they have."),
    }
    hint = hints.get(code, "")
    return hint % {"queue": task.queue} if "%(queue)s" in hint else hint


@portal_page
def task_detail(request: HttpRequest, pk: int) -> HttpResponse:
    task = selectors.task_detail(tenant=request.caller.tenant, pk=pk)
    context = {
        **_task_context(request.caller, task),
        "title": _("Task #%(id)d %(name)s") % {"id": task.pk, "name": task.name},
        "active": "tasks",
        "spec_yaml": yaml.safe_dump(task.spec, sort_keys=False, allow_unicode=True),
    }
    return render(request, "portal/task_detail.html", context)


@require_GET
@portal_page
def task_parts(request: HttpRequest, pk: int) -> HttpResponse:
    """The parts of the task's page that change as it runs, rendered as the page renders them:
    the page fetches them when its socket says the task changed, so it never disagrees with a
    reload."""
    task = selectors.task_detail(tenant=request.caller.tenant, pk=pk)
    return render(request, "portal/task/_parts.html", _task_context(request.caller, task))


def _task_context(who, task) -> dict:
    events = list(task.events.select_related("actor").order_by("at", "id"))
    held = [a for a in task.allocations.all() if a.released_at is None]
    running = task.state == TaskState.RUNNING and task.started_at is not None
    return {
        "task": task,
        "events": events,
        "attempts": list(task.attempts.all()),
        "held": held,
        "simulated": bool(task.node and task.node.backend == "simulated"),
        "wait": task.wait_view,
        "expected_start": task.expected_start,
        "hint": _hint(task) if task.state == TaskState.PENDING else "",
        "controls": controls_for(task) if who.may(Action.CONTROL_TASK, task) else [],
        "may_submit": who.may(Action.SUBMIT),
        "service_path": serviceurl.service_path(task),
        "service_health": serviceurl.service_health(task),
        "gpu_charts": _gpu_charts(task),
        **_service_context(task),
        # Seconds run so far while running: the page counts on from there.
        "running_for": (
            round((timezone.now() - task.started_at).total_seconds(), 1) if running else None
        ),
    }


def _service_context(task) -> dict:
    """A service's replicas (``selectors.service_group``), this task's own among them, and how
    many are healthy; nothing for another task."""
    group = getattr(task, "service_group", None)
    if group is None:
        return {}
    own = next((r.attempt for r in group if r.task.pk == task.pk), None)
    healthy = sum(1 for r in group if r.attempt is not None and r.attempt.health == "healthy")
    return {"replicas": group, "service_attempt": own, "healthy_replicas": healthy}


# Points per GPU the task page's history starts with: enough to see a shape, few enough that
# the page stays small whatever the task's age.
CHART_POINTS = 300


def _gpu_charts(task) -> dict | None:
    """The task's GPUs and their history for its charts (the same read as the API's
    tasks/{id}/metrics/), or None before it has held a GPU. Three queries whatever its age."""
    windows = telemetry_selectors.task_windows(task=task)
    if not windows:
        return None
    start = min(w.start for w in windows)
    end = max(w.end for w in windows) + timedelta(seconds=1)
    step = max(1, int((end - start).total_seconds()) // CHART_POINTS + 1)
    data = telemetry_selectors.series(windows=windows, start=start, end=end, step_s=step)
    # The page's own allocations carry the GPUs (prefetched by task_detail): no extra query.
    gpus = {a.gpu_id: a.gpu for a in task.allocations.all()}
    columns = data["columns"]
    at, util_at, mem_at = (columns.index(name) for name in ("time", "util_gpu", "memory_used_mb"))
    # Each series is columns aligned in time (``values``); the page wants points.
    by_uuid = {
        s["gpu"]: list(zip(s["values"][at], s["values"][util_at], s["values"][mem_at], strict=True))
        for s in data["series"]
    }
    return {
        "socket": "/ws/live/",
        "simulated": bool(task.node and task.node.backend == "simulated"),
        "step": step,
        "gpus": [
            {
                "id": gpu.pk,
                "index": gpu.index,
                "memory_mb": gpu.memory_mb,
                # [time, utilisation %, memory used MiB] per point
                "points": [list(point) for point in by_uuid.get(gpu.uuid, ())],
            }
            for gpu in sorted(gpus.values(), key=lambda g: (g.node_id, g.index))
        ],
        "running": task.state == TaskState.RUNNING,
        "sampled": bool(data["series"]),
    }


@require_POST
@portal_page
def task_control(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    who = request.caller
    if action not in controls.TENANT_ACTIONS:
        raise Http404
    task = selectors.task_get(tenant=who.tenant, pk=pk)
    who.require(Action.CONTROL_TASK, task)
    for _task, why in controls.tasks_control(tasks=[task], action=action, by=request.user).refused:
        messages.error(request, why)
    return redirect("portal:task", pk=pk)


class AttemptQuery(serializers.Serializer):
    attempt = WholeNumber(maximum=INT_MAX, required=False)


@portal_page
def task_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The whole log of one attempt, as a download."""
    who = request.caller
    task = selectors.task_get(tenant=who.tenant, pk=pk)
    number = query.parse(AttemptQuery, request.GET).get("attempt") or task.attempt
    attempt = selectors.task_attempt(tenant=who.tenant, task_id=task.pk, number=number)
    if attempt is None or not attempt.log_path:
        raise Http404
    name = f"task-{task.pk}-attempt-{number}.log"
    where = logs.Where.of(attempt)
    if not where.local:
        return _remote_log(where, name)
    try:
        handle = open(attempt.log_path, "rb")  # FileResponse closes it
    except OSError:
        raise Http404 from None
    return FileResponse(handle, as_attachment=True, filename=name, content_type="text/plain")


def _remote_log(where: logs.Where, name: str) -> HttpResponse:
    """The log from the agent of the node that holds it, streamed a chunk at a time; a 503
    saying why when that node cannot be reached."""
    try:
        start, first, size = logs.fetch(where, offset=0)
    except logs.LogUnavailable as exc:
        message = _("The log cannot be read now: %(reason)s") % {"reason": exc}
        return HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")

    def chunks():
        offset = start + len(first)
        yield first
        while offset < size:
            data = logs.fetch(where, offset=offset)[1]
            if not data:
                return
            offset += len(data)
            yield data

    answer = StreamingHttpResponse(chunks(), content_type="text/plain")
    answer["Content-Disposition"] = f'attachment; filename="{name}"'
    return answer


# --- Submitting -----------------------------------------------------------------------------------


class SubmitQuery(serializers.Serializer):
    mode = serializers.ChoiceField(choices=["form", "yaml", "notebook"], default="form")
    clone = WholeNumber(required=False)  # a task's id


@portal_page
def submit(request: HttpRequest) -> HttpResponse:
    who = request.caller
    if request.method == "POST":
        who.require(Action.SUBMIT)
    asked = query.parse(SubmitQuery, request.GET)
    mode = request.POST.get("mode") or asked["mode"]
    clone = None
    if "clone" in asked:
        clone = selectors.task_get(tenant=who.tenant, pk=asked["clone"])
    offers = _offers(who) if mode != "yaml" else None
    form = TaskForm(
        initial=TaskForm.initial_from(clone) if clone else None, prefix="task", offers=offers
    )
    yaml_form = YamlForm(
        initial={
            "spec": yaml.safe_dump(clone.spec, sort_keys=False, allow_unicode=True)
            if clone
            else yaml_example()
        },
        prefix="yaml",
    )
    notebook_form = NotebookForm(prefix="notebook", offers=offers)
    if request.method == "POST":
        if mode == "form":
            bound = form = TaskForm(request.POST, prefix="task", offers=offers)
        elif mode == "notebook":
            bound = notebook_form = NotebookForm(request.POST, prefix="notebook", offers=offers)
        else:
            mode = "yaml"
            bound = yaml_form = YamlForm(request.POST, prefix="yaml")
        if bound.is_valid():
            try:
                with transaction.atomic():
                    tasks = tasks_submit(
                        tenant=who.tenant, specs=bound.cleaned_data["specs"], owner=request.user
                    )
            except SpecError as exc:
                bound.add_refusal(exc)
            else:
                messages.success(
                    request,
                    _("Submitted %(n)d task(s): %(ids)s")
                    % {"n": len(tasks), "ids": ", ".join(f"#{t.pk}" for t in tasks[:20])},
                )
                if mode == "notebook":  # opened at once: the gateway waits with the browser
                    return redirect(f"{serviceurl.PREFIX}{tasks[0].pk}/")
                if len(tasks) == 1:
                    return redirect("portal:task", pk=tasks[0].pk)
                return redirect("portal:tasks")
        status = 400
    else:
        status = 200
    return render(
        request,
        "portal/submit.html",
        {
            "title": _("Submit"),
            "active": "submit",
            "form": form,
            "yaml_form": yaml_form,
            "notebook_form": notebook_form,
            "mode": mode,
            "clone": clone,
        },
        status=status,
    )


def _offers(who) -> dict[str, list[tuple[str, str]]]:
    """The form's GPU type and pool choices; what the quota leaves only for those the role
    matrix shows the quota to (tenant admins), as on the overview."""
    types, pools = selectors.gpu_offers()
    if not who.may(Action.VIEW_QUOTA):
        return offer_choices(types, pools, quota=False)
    cluster_left, pool_left = tenant_usage.gpus_quota_left(tenant=who.tenant)
    return offer_choices(types, pools, quota=True, cluster_left=cluster_left, pool_left=pool_left)


@portal_page
def spec_reference(request: HttpRequest) -> HttpResponse:
    """Every key of a task and of a sweep, what it takes, its limits and default: the table the
    YAML editor links to, rendered from the spec's schema."""
    return render(
        request,
        "portal/spec_reference.html",
        {"title": _("Spec reference"), "active": "submit", "help": YamlForm().spec_help()},
    )


@require_POST
@portal_page
def submit_preview(request: HttpRequest) -> JsonResponse:
    """How many tasks a YAML spec expands to (sweeps included), or its problems, before it is
    submitted. Checks the spec only: quotas and the cluster are checked on submit."""
    request.caller.require(Action.SUBMIT)
    try:
        specs = parse_yaml(request.POST.get("spec", ""))
    except SpecError as exc:
        return JsonResponse({"count": None, "errors": exc.errors}, status=400)
    return JsonResponse({"count": len(specs), "names": [s.name for s in specs[:10]], "errors": {}})


# --- Usage ----------------------------------------------------------------------------------------


class UsageQuery(serializers.Serializer):
    days = serializers.ChoiceField(choices=USAGE_DAYS, default=30)


def _usage_days(request: HttpRequest) -> int:
    return query.parse(UsageQuery, request.GET)["days"]


def _usage(tenant, days: int) -> tuple[list[dict], list[dict]]:
    """Per day and per member: GPU-hours allocated (from allocations) beside those actually
    used (utilisation-weighted) and held idle, as telemetry sampled them. A day or member with
    no samples shows None for the sampled figures (not measured), never 0."""
    per_day = tenant_usage.usage_per_day(tenant=tenant, days=days)
    per_member = tenant_usage.usage_per_member(tenant=tenant, days=days)
    sampled_day: dict[str, list[float]] = {}
    sampled_member: dict[str, list[float]] = {}
    for row in telemetry_selectors.usage_from_samples(tenant=tenant, days=days):
        for table, key in ((sampled_day, row["day"]), (sampled_member, row["member"])):
            figures = table.setdefault(key, [0.0, 0.0])
            figures[0] += row["used_gpu_hours"]
            figures[1] += row["idle_gpu_hours"]
    for row in per_day:
        used, idle = sampled_day.get(row["day"].isoformat(), (None, None))
        row["used_gpu_hours"], row["idle_gpu_hours"] = used, idle
    for row in per_member:
        used, idle = sampled_member.get(row["member"] or "", (None, None))
        row["used_gpu_hours"], row["idle_gpu_hours"] = used, idle
    return per_day, per_member


@portal_page
def usage(request: HttpRequest) -> HttpResponse:
    who = request.caller
    days = _usage_days(request)
    per_day, per_member = _usage(who.tenant, days)
    peak = max((row["gpu_hours"] for row in per_day), default=0) or 1
    for row in per_day:
        row["percent"] = round(100 * row["gpu_hours"] / peak, 1)
        # The used bar sits inside the allocated one: its height is a share of that bar.
        share = (row["used_gpu_hours"] or 0) / row["gpu_hours"] if row["gpu_hours"] else 0
        row["used_share"] = round(100 * min(share, 1), 1)
    total = sum(row["gpu_hours"] for row in per_day)
    used = sum(row["used_gpu_hours"] or 0 for row in per_day)
    idle = sum(row["idle_gpu_hours"] or 0 for row in per_day)
    return render(
        request,
        "portal/usage.html",
        {
            "title": _("Usage"),
            "active": "usage",
            "days": days,
            "day_choices": USAGE_DAYS,
            "per_day": per_day,
            "per_member": per_member,
            "total": total,
            "used": used,
            "idle": idle,
        },
    )


def _hours(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


@portal_page
def usage_csv(request: HttpRequest) -> HttpResponse:
    who = request.caller
    days = _usage_days(request)
    per_day, per_member = _usage(who.tenant, days)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{who.tenant.name}-{days}d.csv"'
    writer = csv.writer(response)
    figures = ["gpu_hours_allocated", "gpu_hours_used", "gpu_hours_idle_allocated"]
    writer.writerow(["day", *figures])
    for row in per_day:
        writer.writerow([row["day"].isoformat(), f"{row['gpu_hours']:.4f}",
                         _hours(row["used_gpu_hours"]), _hours(row["idle_gpu_hours"])])  # fmt: skip
    writer.writerow([])
    writer.writerow(["member", *figures])
    for row in per_member:
        writer.writerow([row["member"] or "", f"{row['gpu_hours']:.4f}",
                         _hours(row["used_gpu_hours"]), _hours(row["idle_gpu_hours"])])  # fmt: skip
    return response


# --- Tokens and team ------------------------------------------------------------------------------


@portal_page
def tokens(request: HttpRequest) -> HttpResponse:
    who = request.caller
    every = who.may(Action.MANAGE_TOKENS)
    form = TokenForm()
    secret = None
    if request.method == "POST":
        who.require(Action.OWN_TOKENS)
        form = TokenForm(request.POST)
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            expires = timezone.now() + timedelta(days=days) if days else None
            token, secret = tenant_services.apitoken_create(
                user=request.user, tenant=who.tenant, name=form.cleaned_data["name"],
                expires_at=expires,
            )  # fmt: skip
            form = TokenForm()
    rows = tenant_selectors.token_list(tenant=who.tenant, user=None if every else request.user)
    return render(
        request,
        "portal/tokens.html",
        {
            "title": _("API tokens"),
            "active": "tokens",
            "form": form,
            "secret": secret,
            "tokens": rows,
            "every": every,
        },
        status=400 if form.errors else 200,
    )


@require_POST
@portal_page
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    who = request.caller
    every = who.may(Action.MANAGE_TOKENS)
    rows = tenant_selectors.token_list(tenant=who.tenant, user=None if every else request.user)
    if not rows.filter(pk=pk).exists():
        raise Http404
    tenant_services.apitokens_revoke(tokens=rows.filter(pk=pk))
    messages.success(request, _("Token revoked."))
    return redirect("portal:tokens")


@portal_page
def team(request: HttpRequest) -> HttpResponse:
    who = request.caller
    who.require(Action.MANAGE_MEMBERS)
    form = MemberForm()
    if request.method == "POST":
        form = MemberForm(request.POST)
        if form.is_valid():
            user = (
                get_user_model()
                .objects.filter(username=form.cleaned_data["username"], is_active=True)
                .first()
            )
            if user is None:
                form.add_error("username", _("No such user."))
            else:
                try:
                    tenant_services.membership_change(
                        tenant=who.tenant, user=user, role=form.cleaned_data["role"]
                    )
                except tenant_services.LastAdmin as exc:
                    form.add_error("role", str(exc))
                else:
                    messages.success(request, _("Saved."))
                    return redirect("portal:team")
    return render(
        request,
        "portal/team.html",
        {
            "title": _("Team"),
            "active": "team",
            "form": form,
            "members": tenant_selectors.member_list(tenant=who.tenant),
            "roles": [(Role.VIEWER, _("viewer")), (Role.MEMBER, _("member")),
                      (Role.ADMIN, _("admin"))],
        },
        status=400 if form.errors else 200,
    )  # fmt: skip


@require_POST
@portal_page
def member_remove(request: HttpRequest, username: str) -> HttpResponse:
    who = request.caller
    who.require(Action.MANAGE_MEMBERS)
    membership = tenant_selectors.member_get(tenant=who.tenant, username=username)
    try:
        tenant_services.membership_remove(membership=membership)
    except tenant_services.LastAdmin as exc:
        messages.error(request, str(exc))
    return redirect("portal:team")
