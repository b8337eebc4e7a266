"""Admin pieces shared by the apps."""

from __future__ import annotations

from django.contrib import admin


class ReadOnly:
    """Look, never touch: no add, change or delete, whatever the user's permissions."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyAdmin(ReadOnly, admin.ModelAdmin):
    """Rows the platform writes itself (audit trails, observed state): operators look, and act
    only through the admin actions a subclass adds."""


class ReadOnlyInline(ReadOnly, admin.TabularInline):
    """History shown beside its parent (attempts, allocations, events): look, never touch."""

    extra = 0
