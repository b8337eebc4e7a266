"""The admin's forms that are not a model's form. They read what an operator typed and hand it to
the services the API calls; a refusal shows on the field it names, in the service's words."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from scheduling.forms import SpecRefusals
from scheduling.spec import PRIORITIES, SpecError, parse_priority, parse_yaml
from tenants import roles
from tenants.models import Membership, Tenant

SPEC_EXAMPLE = """name: train
command: python train.py
resources:
  gpus: 1
"""


class OwnerChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj) -> str:
        tenants = [f"{m.tenant.name}: {m.role}" for m in obj.memberships.all()]
        return f"{obj.get_username()} ({', '.join(tenants)})"


class SubmitForTenantForm(SpecRefusals, forms.Form):
    """Submit on behalf of a tenant: the same spec, checks and quotas as ``POST /api/v1/tasks/``
    and ``gpuctl submit``; the task belongs to ``owner``."""

    spec_fields = {"tenant": "tenant", "owner": "owner"}
    catch_all = "spec"

    tenant = forms.ModelChoiceField(queryset=Tenant.objects.order_by("name"))
    owner = OwnerChoiceField(
        queryset=get_user_model()
        .objects.filter(memberships__isnull=False)
        .distinct()
        .order_by("username")
        .prefetch_related("memberships__tenant"),
        help_text="A member of the tenant who may submit (admin or member); the task is theirs.",
    )
    spec = forms.CharField(
        strip=False,
        widget=forms.Textarea(attrs={"rows": 18, "cols": 90, "placeholder": SPEC_EXAMPLE}),
        help_text="YAML or JSON, as gpuctl submit -f and POST /api/v1/tasks/ take it: one task, "
        "a list, a sweep, or several YAML documents.",
    )

    def clean(self):
        data = super().clean()
        tenant, owner = data.get("tenant"), data.get("owner")
        if tenant is not None and owner is not None:
            member = Membership.objects.filter(user=owner, tenant=tenant).first()
            if member is None or not roles.may(role=member.role, action=roles.Action.SUBMIT):
                role = f"is a {member.role} there" if member else "is not a member"
                self.add_error(
                    "owner",
                    f"{owner.get_username()} {role}: only an admin or member of {tenant.name} "
                    "may own its tasks",
                )
        if "spec" in data:
            try:
                data["specs"] = parse_yaml(data["spec"])
            except SpecError as exc:
                self.add_refusal(exc)
        return data


class PriorityForm(forms.Form):
    """The new priority of the tasks an operator selected."""

    priority = forms.CharField(
        max_length=10, help_text=f"{', '.join(PRIORITIES)} or a whole number 0-100"
    )

    def clean_priority(self) -> int:
        raw = self.cleaned_data["priority"].strip()
        try:
            return parse_priority(int(raw) if raw.isascii() and raw.isdigit() else raw)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
