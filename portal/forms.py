"""The portal's forms. A task form builds the same spec a YAML file or ``POST /api/v1/tasks/``
would carry and hands it to the same parser and submit service; a refusal is shown beside the
field it names, in the service's words. Its length limits are the spec schema's
(scheduling.spec.reference); the other fields are checked by the parser alone."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.validators import RegexValidator
from django.utils.translation import gettext_lazy as _

from gpuplatform import throttle
from scheduling.forms import SpecRefusals
from scheduling.spec import PRIORITIES, SpecError, parse_specs, parse_yaml
from scheduling.spec.reference import help_rows, max_length
from tenants.models import Role

# Where a spec path's problem is shown on the task form.
SPEC_FIELDS = {
    "name": "name",
    "command": "command",
    "queue": "queue",
    "priority": "priority",
    "class": "task_class",
    "workdir": "workdir",
    "env": "env",
    "resources.gpus": "gpus",
    "resources.gpu_memory": "gpu_memory",
    "resources.gpu_type": "gpu_type",
    "resources.pool": "pool",
    "policy.timeout": "timeout",
    "policy.retries": "retries",
    "policy.after": "after",
    # The most specific first: a path shows on the first key it is or is below.
    "service.port": "service_port",
    "service.health.path": "health_path",
    "service.health.start_period": "health_start_period",
    "service.health": "health_path",
    "service.replicas": "replicas",
    "service": "service_port",
}
SERVICE_FIELDS = ("service_port", "health_path", "health_start_period", "replicas")


class TaskForm(SpecRefusals, forms.Form):
    """The common fields of one task."""

    spec_fields = SPEC_FIELDS

    name = forms.CharField(label=_("Name"), max_length=max_length("name"))
    command = forms.CharField(
        label=_("Command"),
        max_length=max_length("command"),
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text=_("Run by <code>/bin/sh -c</code> in the working directory."),
    )
    gpus = forms.CharField(
        label=_("GPUs"),
        initial="1",
        help_text=_("A number, or a range such as 1-4 (takes what is free, up to 4)."),
    )
    gpu_memory = forms.CharField(
        label=_("GPU memory"),
        required=False,
        help_text=_("Per GPU, such as 20Gi: lets tasks share a card. Empty: whole GPUs."),
    )
    # Choices from the inventory (``offer_choices``), set by the view; "" is any.
    gpu_type = forms.ChoiceField(label=_("GPU type"), required=False, choices=[("", _("any"))])
    pool = forms.ChoiceField(label=_("Pool"), required=False, choices=[("", _("any"))])
    queue = forms.CharField(
        label=_("Queue"),
        required=False,
        max_length=max_length("queue"),
        help_text=_("Tasks in one queue run one at a time, in order."),
    )
    priority = forms.CharField(
        label=_("Priority"),
        initial="normal",
        help_text=_(
            "<code>low</code>, <code>normal</code>, <code>high</code>, or a whole number 0-100."
        ),
    )
    task_class = forms.ChoiceField(
        label=_("Class"),
        choices=[("batch", _("batch (may be preempted)")), ("online", _("online (service)"))],
        initial="batch",
    )
    timeout = forms.CharField(label=_("Timeout"), required=False, help_text=_("Such as 30m or 6h."))
    retries = forms.CharField(label=_("Retries"), required=False, initial="0")
    env = forms.CharField(
        label=_("Environment"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text=_("One <code>NAME=value</code> a line."),
    )
    workdir = forms.CharField(
        label=_("Working directory"),
        required=False,
        max_length=max_length("workdir"),
        help_text=_("Relative to your tenant's directory."),
    )
    after = forms.CharField(
        label=_("After"),
        required=False,
        help_text=_("Start only after these tasks succeeded: ids or names, comma-separated."),
    )

    # A service (the spec's service block): any of these given makes the task one.
    service_port = forms.CharField(
        label=_("Service port"),
        required=False,
        help_text=_(
            "<code>auto</code> (a free port on the node, given to the task as <code>$PORT</code>) "
            "or a number. Empty: not a service. A service runs as class <code>online</code>."
        ),
    )
    health_path = forms.CharField(
        label=_("Health check"),
        required=False,
        help_text=_("A path such as /health, asked on the service's port; empty: none."),
    )
    health_start_period = forms.CharField(
        label=_("Start-up time"),
        required=False,
        help_text=_("How long start-up may take before failed checks count, such as 10m."),
    )
    replicas = forms.CharField(
        label=_("Replicas"),
        required=False,
        help_text=_("Copies of the service, each with its own GPUs (default 1)."),
    )

    def main_fields(self) -> list:
        return [field for field in self if field.name not in SERVICE_FIELDS]

    def service_fields(self) -> list:
        return [self[name] for name in SERVICE_FIELDS]

    def __init__(self, *args, offers: dict[str, list[tuple[str, str]]] | None = None, **kwargs):
        """``offers``: the choices of ``gpu_type`` and ``pool`` (:func:`offer_choices`). A value
        not among them (a clone's type that is gone, or one posted meanwhile) stays, selected
        and labelled as missing: the spec parser and the submit service judge it, as the API's
        would, instead of the form silently changing it."""
        super().__init__(*args, **kwargs)
        for name, choices in (offers or {}).items():
            self.fields[name].choices = choices
        for name in ("gpu_type", "pool"):
            field = self.fields[name]
            if self.is_bound:
                value = self.data.get(self.add_prefix(name), "")
            else:
                value = self.initial.get(name, "")
            known = {str(choice) for choice, _label in field.choices}
            limit = max_length(f"resources.{name}")
            if isinstance(value, str) and value and value not in known and len(value) <= limit:
                missing = _("%(name)s: not in the inventory now") % {"name": value}
                field.choices = [*field.choices, (value, missing)]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        spec = self.spec_data(data)
        if spec is None:
            return data
        try:
            data["specs"] = parse_specs(spec)
        except SpecError as exc:
            self.add_refusal(exc)
        return data

    def spec_data(self, data: dict) -> dict | None:
        env: dict[str, str] = {}
        for number, line in enumerate(data.get("env", "").splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                self.add_error("env", _("line %(n)d: expected NAME=value") % {"n": number})
                return None
            env[key.strip()] = value
        priority: str | int = data["priority"].strip()
        if priority.isascii() and priority.isdigit():
            priority = int(priority)
        retries: str | int = data.get("retries", "").strip() or 0
        if isinstance(retries, str) and retries.isascii() and retries.isdigit():
            retries = int(retries)
        gpus: str | int = data["gpus"].strip()
        if gpus.isascii() and gpus.isdigit():
            gpus = int(gpus)
        after = [
            int(ref) if ref.isascii() and ref.isdigit() else ref
            for ref in (part.strip() for part in data.get("after", "").split(","))
            if ref
        ]
        resources = {"gpus": gpus}
        for key in ("gpu_memory", "gpu_type", "pool"):
            if data.get(key, "").strip():
                resources[key] = data[key].strip()
        policy: dict = {"retries": retries}
        if data.get("timeout", "").strip():
            policy["timeout"] = data["timeout"].strip()
        if after:
            policy["after"] = after
        spec = {
            "kind": "task",
            "name": data["name"].strip(),
            "command": data["command"],
            "priority": priority,
            "class": data["task_class"],
            "resources": resources,
            "policy": policy,
        }
        for key in ("queue", "workdir"):
            if data.get(key, "").strip():
                spec[key] = data[key].strip()
        if env:
            spec["env"] = env
        if service := self._service(data):
            spec["service"] = service
            if spec["class"] == "batch":  # the form's default: a service is online
                del spec["class"]
        return spec

    @staticmethod
    def _service(data: dict) -> dict:
        """The service block from the service fields; empty when none is given."""
        service: dict = {}
        port = data.get("service_port", "").strip()
        if port:
            service["port"] = int(port) if port.isascii() and port.isdigit() else port
        path = data.get("health_path", "").strip()
        start = data.get("health_start_period", "").strip()
        if path or start:
            service["health"] = {"path": path, **({"start_period": start} if start else {})}
        replicas = data.get("replicas", "").strip()
        if replicas:
            service["replicas"] = (
                int(replicas) if replicas.isascii() and replicas.isdigit() else replicas
            )
        return service

    @classmethod
    def initial_from(cls, task) -> dict:
        """The form filled from a past task (clone and edit)."""
        spec = task.spec or {}
        resources, policy = spec.get("resources") or {}, spec.get("policy") or {}
        priority = {v: k for k, v in PRIORITIES.items()}.get(task.priority, str(task.priority))
        return {
            "name": task.name,
            "command": task.command,
            "gpus": str(resources.get("gpus", task.gpus_min)),
            "gpu_memory": resources.get("gpu_memory") or "",
            "gpu_type": task.gpu_type,
            "pool": resources.get("pool") or "",
            "queue": task.queue,
            "priority": priority,
            "task_class": task.task_class,
            "timeout": policy.get("timeout") or "",
            "retries": str(task.retries),
            "env": "\n".join(f"{k}={v}" for k, v in (task.env or {}).items()),
            "workdir": task.workdir,
            "after": ", ".join(str(ref) for ref in policy.get("after") or []),
            **_service_initial(spec.get("service")),
        }


def _service_initial(service: dict | None) -> dict:
    if not service:
        return {}
    health = service.get("health") or {}
    return {
        "service_port": str(service.get("port", "auto")),
        "health_path": health.get("path", ""),
        "health_start_period": str(health["start_period"]) if health else "",
        "replicas": str(service.get("replicas", 1)),
    }


def _gpus(count: float) -> str:
    return str(int(count)) if float(count).is_integer() else f"{count:.2f}".rstrip("0")


def _offer_label(name: str, free: int, total: int, *, quota: bool, left: float | None) -> str:
    counts = {"name": name, "free": free, "total": total}
    if not quota:
        return _("%(name)s: %(free)d of %(total)d free") % counts
    if left is None:
        return _("%(name)s: %(free)d of %(total)d free; no quota limit") % counts
    return _("%(name)s: %(free)d of %(total)d free; your quota allows %(left)s more") % {
        **counts,
        "left": _gpus(left),
    }


def offer_choices(
    types: list,
    pools: list,
    *,
    quota: bool,
    cluster_left: float | None = None,
    pool_left: dict[str, float | None] | None = None,
) -> dict[str, list[tuple[str, str]]]:
    """The task form's ``gpu_type`` and ``pool`` choices: any, then each type and pool of the
    inventory (``scheduling.selectors.gpu_offers``) with its free and total GPUs and, when the
    caller may see the quota (``quota``), how many more GPUs it lets the tenant hold there."""
    pool_left = pool_left or {}
    free, total = sum(o.free for o in types), sum(o.total for o in types)
    choices: dict[str, list[tuple[str, str]]] = {}
    for field, offers, any_name in (
        ("gpu_type", types, _("any type")),
        ("pool", pools, _("any pool")),
    ):
        choices[field] = [("", _offer_label(any_name, free, total, quota=quota, left=cluster_left))]
        for offer in offers:
            left = pool_left.get(offer.name, cluster_left) if field == "pool" else cluster_left
            label = _offer_label(offer.name, offer.free, offer.total, quota=quota, left=left)
            choices[field].append((offer.name, label))
    return choices


# The YAML editor's first text when it is not cloning a task: a task to edit, a comment on each
# key, and a sweep to uncomment. tests/portal/test_submit_form.py checks that it parses as it
# is and with the sweep uncommented.
YAML_EXAMPLE = """\
# %(intro)s
kind: task
name: my-training
command: python train.py --epochs 3   # %(command)s
resources:
  gpus: 1              # %(gpus)s
  gpu_memory: 8Gi      # %(gpu_memory)s
queue: experiments     # %(queue)s
policy:
  timeout: 6h          # %(timeout)s

# %(sweep)s
# ---
# kind: sweep
# name: lr-sweep
# parameters:
#   lr: [0.01, 0.001]
# template:
#   command: python train.py --lr {lr}
#   resources: {gpus: 1}
"""


def yaml_example() -> str:
    return YAML_EXAMPLE % {
        "intro": _("An example task: change it and submit. Every key: the spec reference."),
        "command": _("run by /bin/sh -c in your tenant's directory"),
        "gpus": _("or a range such as 1-4: takes what is free, up to 4"),
        "gpu_memory": _("per GPU, lets tasks share a card; remove it for whole GPUs"),
        "queue": _("tasks in one queue run one at a time, in order"),
        "timeout": _("stopped, and failed, after this long"),
        "sweep": _("A sweep, one task per value of lr: uncomment the lines below to add it."),
    }


class YamlForm(SpecRefusals, forms.Form):
    """The full spec: one task, a list, a sweep, or several YAML documents."""

    catch_all = "spec"
    spec = forms.CharField(
        label=_("YAML spec"),
        strip=False,
        widget=forms.Textarea(attrs={"rows": 18, "cols": 80, "spellcheck": "false"}),
        help_text=_(
            "As <code>gpuctl submit -f</code> takes it: a task, a list, a sweep, or several "
            "documents."
        ),
    )

    def spec_help(self):
        """The keys of a task and of a sweep, what each takes and its limits, from the schema:
        the editor's help."""
        return help_rows()

    def clean(self):
        data = super().clean()
        if "spec" in data:
            try:
                data["specs"] = parse_yaml(data["spec"])
            except SpecError as exc:
                self.add_refusal(exc)
        return data


# JupyterLab as a service: on the port the platform assigns ($PORT), under the gateway's path for
# this task (its base URL: the gateway passes the path on whole), without a token of its own
# (the platform's authentication stands in front) and accepting the Host the browser used.
NOTEBOOK_COMMAND = (
    "{python} -c 'import jupyterlab' 2>/dev/null || "
    "{{ echo 'JupyterLab is not installed for {python}: {python} -m pip install jupyterlab' >&2; "
    "exit 127; }}\n"
    'exec {python} -m jupyterlab --no-browser --ip 127.0.0.1 --port "$PORT" '
    "--ServerApp.port_retries=0 "
    '--ServerApp.base_url="/services/$GPUPLATFORM_TASK_ID/" '
    "--ServerApp.token='' --ServerApp.password='' --ServerApp.allow_remote_access=True "
    "--allow-root"  # a platform that runs tasks as root (single-user, as root) decided so
)
INTERPRETER = RegexValidator(
    r"^[A-Za-z0-9_./+-]+$", _("A command name or path, such as python3 or envs/lab/bin/python.")
)


class NotebookForm(SpecRefusals, forms.Form):
    """JupyterLab in two clicks: a service task that runs it with the given interpreter, opened
    through the platform once it answers."""

    spec_fields = {**SPEC_FIELDS, "command": "python"}

    name = forms.CharField(label=_("Name"), max_length=max_length("name"), initial="notebook")
    python = forms.CharField(
        label=_("Python"),
        initial="python3",
        max_length=200,
        validators=[INTERPRETER],
        help_text=_("The interpreter that has JupyterLab (pip install jupyterlab)."),
    )
    gpus = forms.CharField(label=_("GPUs"), initial="1", help_text=_("A number; 0 for none."))
    gpu_type = forms.ChoiceField(label=_("GPU type"), required=False, choices=[("", _("any"))])
    timeout = forms.CharField(
        label=_("Timeout"), required=False, initial="8h", help_text=_("Such as 30m or 6h.")
    )

    def __init__(self, *args, offers: dict[str, list[tuple[str, str]]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if offers and "gpu_type" in offers:
            self.fields["gpu_type"].choices = offers["gpu_type"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            data["specs"] = parse_specs(notebook_spec(data))
        except SpecError as exc:
            self.add_refusal(exc)
        return data


def notebook_spec(data: dict) -> dict:
    """The task spec of a notebook from the notebook form's cleaned data."""
    gpus: str | int = data["gpus"].strip()
    if gpus.isascii() and gpus.isdigit():
        gpus = int(gpus)
    resources: dict = {"gpus": gpus}
    if data.get("gpu_type"):
        resources["gpu_type"] = data["gpu_type"]
    policy = {"timeout": data["timeout"].strip()} if data.get("timeout", "").strip() else {}
    return {
        "kind": "task",
        "name": data["name"].strip(),
        "command": NOTEBOOK_COMMAND.format(python=data["python"]),
        "class": "online",
        "resources": resources,
        "policy": policy,
        "service": {"port": "auto"},
    }


class TokenForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    expires_in_days = forms.IntegerField(
        label=_("Expires in (days)"),
        required=False,
        min_value=1,
        max_value=3650,
        help_text=_("Empty: never expires."),
    )


class MemberForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150)
    role = forms.ChoiceField(
        label=_("Role"),
        choices=[(Role.VIEWER, _("viewer")), (Role.MEMBER, _("member")), (Role.ADMIN, _("admin"))],
    )


class ThrottledLoginForm(AuthenticationForm):
    """Django's sign-in form for every active user (tenant members too, not only staff),
    paced per username and per client address (LOGIN_THROTTLE_RATE)."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": _("Too many sign-in attempts. Try again in %(seconds)d seconds."),
    }

    def clean(self):
        username = (self.data.get("username") or "").strip().lower()
        address = self.request.META.get("REMOTE_ADDR", "") if self.request else ""
        rate = settings.LOGIN_THROTTLE_RATE
        for key in (f"login-user-{username[:60]}", f"login-addr-{address}"):
            verdict = throttle.consume(key, rate)
            if not verdict.allowed:
                self.throttled = True
                raise forms.ValidationError(
                    self.error_messages["throttled"],
                    code="throttled",
                    params={"seconds": max(1, round(verdict.wait_s))},
                )
        return super().clean()
