"""The operators' admin for tenants, members, quotas and tokens. Every write goes through the
services the API and the portal use (``tenants.services``, ``scheduling.quotas``): a removed
member's tokens are revoked, a tenant keeps its last admin, a quota change wakes the scheduler."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Count
from django.forms.models import BaseInlineFormSet
from django.http import HttpResponseRedirect
from django.urls import reverse

from scheduling import quotas
from tenants import services
from tenants.models import ApiToken, Membership, Quota, Tenant

# What a service refuses with: the form checked the model's rules already, so a ValidationError
# here means another write got there first.
REFUSALS = (services.LastAdmin, ValidationError)


class RefusalsAsMessages:
    """A service's refusal is an error message over the page, not a 500. The admin's views
    save in a transaction, which the refusal rolls back: nothing the request did stays."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except REFUSALS as exc:
            return self.refused(request, exc, request.get_full_path())

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except REFUSALS as exc:
            name = f"admin:{self.opts.app_label}_{self.opts.model_name}_change"
            back = reverse(name, args=[object_id], current_app=self.admin_site.name)
            return self.refused(request, exc, back)

    def response_action(self, request, queryset):
        # An action over several rows does all of them or none, as a form's save does.
        try:
            with transaction.atomic():
                return super().response_action(request, queryset)
        except REFUSALS as exc:
            return self.refused(request, exc, request.get_full_path())

    def refused(self, request, exc: Exception, back: str) -> HttpResponseRedirect:
        said = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
        self.message_user(request, said, messages.ERROR)
        return HttpResponseRedirect(back)


def take_row(obj: models.Model, saved: models.Model) -> None:
    """The admin goes on with its own instance (inlines, log entry and redirect use it): give
    it the row the service saved."""
    for field in obj._meta.concrete_fields:
        setattr(obj, field.attname, getattr(saved, field.attname))
    obj._state.adding = False
    obj._state.db = saved._state.db


class MembershipInlineForm(forms.ModelForm):
    """A saved row's user stays: giving the row to someone else would remove a member without
    revoking its tokens (remove the row, add another)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["user"].disabled = True


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipInlineForm
    extra = 0
    autocomplete_fields = ["user"]
    readonly_fields = ["created_at"]


class QuotaFormSet(BaseInlineFormSet):
    """Each row is checked by the model (Quota.validate_constraints) against the saved quotas;
    this adds what no row can see alone: two new rows for the same place."""

    def clean(self) -> None:
        super().clean()
        seen: set[int | None] = set()
        for form in self.forms:
            if not form.cleaned_data or self._should_delete_form(form):
                continue
            pool = form.cleaned_data.get("pool")
            place = pool.pk if pool is not None else None
            if place in seen:
                form.add_error("pool", "this tenant already has a quota here")
            seen.add(place)


class QuotaInline(admin.TabularInline):
    model = Quota
    formset = QuotaFormSet
    extra = 0


@admin.register(Tenant)
class TenantAdmin(RefusalsAsMessages, admin.ModelAdmin):
    list_display = ["name", "display_name", "is_active", "member_count", "unix_user", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "display_name", "description"]
    readonly_fields = ["created_at"]
    inlines = [MembershipInline, QuotaInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(ordering="member_count", description="members")
    def member_count(self, obj: Tenant) -> int:
        return obj.member_count

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
        else:
            take_row(obj, services.tenant_create(**form.cleaned_data))

    def save_formset(self, request, form, formset, change):
        if formset.model not in (Membership, Quota):
            super().save_formset(request, form, formset, change)
            return
        formset.save(commit=False)  # sorts the rows into new, changed and deleted; saves none
        kept = [*formset.new_objects, *(row for row, _ in formset.changed_objects)]
        if formset.model is Membership:
            # Changes before removals: an operator may hand the admin role over in one save.
            for row in kept:
                changed = services.membership_change(
                    tenant=row.tenant, user=row.user, role=row.role
                )
                take_row(row, changed)
            for row in formset.deleted_objects:
                services.membership_remove(membership=row)
        else:
            for row in formset.deleted_objects:
                quotas.quota_delete(quota=row)
            for row in kept:
                quotas.quota_set(quota=row)


@admin.register(Membership)
class MembershipAdmin(RefusalsAsMessages, admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]
    list_select_related = ["user", "tenant"]
    readonly_fields = ["created_at"]

    def get_readonly_fields(self, request, obj=None):
        # A saved row's user and tenant stay: moving it would remove a member without revoking
        # its tokens, and could take a tenant's last admin away.
        fields = super().get_readonly_fields(request, obj)
        return fields if obj is None else [*fields, "user", "tenant"]

    def save_model(self, request, obj, form, change):
        take_row(obj, services.membership_change(tenant=obj.tenant, user=obj.user, role=obj.role))

    def delete_model(self, request, obj):
        services.membership_remove(membership=obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for membership in queryset.select_related("user", "tenant"):
                services.membership_remove(membership=membership)


@admin.register(Quota)
class QuotaAdmin(RefusalsAsMessages, admin.ModelAdmin):
    list_display = [
        "tenant",
        "pool",
        "max_gpus",
        "max_gpu_memory_mb",
        "max_running_tasks",
        "max_queued_tasks",
        "max_priority",
        "fair_share_weight",
        "updated_at",
    ]
    list_filter = ["pool", "tenant"]
    search_fields = ["tenant__name"]
    list_select_related = ["tenant", "pool"]
    readonly_fields = ["updated_at"]

    def save_model(self, request, obj, form, change):
        quotas.quota_set(quota=obj)

    def delete_model(self, request, obj):
        quotas.quota_delete(quota=obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for quota in queryset:
                quotas.quota_delete(quota=quota)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by their owners (API, CLI, portal); operators list and revoke them."""

    list_display = [
        "prefix",
        "name",
        "user",
        "tenant",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username", "tenant__name"]
    list_select_related = ["user", "tenant"]
    readonly_fields = [
        "prefix",
        "user",
        "tenant",
        "name",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    fields = readonly_fields[:4] + ["expires_at"] + readonly_fields[4:]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        # The secret must be shown to its owner once; an admin form has nowhere safe to do so.
        return False

    @admin.action(description="Revoke selected tokens now")
    def revoke(self, request, queryset):
        count = services.apitokens_revoke(tokens=queryset)
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)
