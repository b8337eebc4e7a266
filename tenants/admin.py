from django.contrib import admin, messages
from django.db.models import Count
from django.forms.models import BaseInlineFormSet

from scheduling import passes
from tenants import services
from tenants.models import ApiToken, Membership, Quota, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
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
class TenantAdmin(admin.ModelAdmin):
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


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name"]
    autocomplete_fields = ["user", "tenant"]
    list_select_related = ["user", "tenant"]
    readonly_fields = ["created_at"]


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
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
        super().save_model(request, obj, form, change)
        passes.request_pass()  # a raised limit may let waiting tasks start

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        passes.request_pass()


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
