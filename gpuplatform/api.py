"""What every API view shares: the caller's tenant, roles, errors, paging and throttling.

One choke point for tenant scoping: views get the caller and its tenant from
``request_tenant()`` (``tenants.access.caller_for``, as the portal and the websockets do) and
read through selectors that take it; another tenant's object is simply not found (404), never
forbidden. One choke point for roles: ``IsTenantMember`` asks ``tenants.roles`` whether the
caller's role may do the view's action (``tenant_actions``), and views ask ``Caller.require()``
about one object (a member may control only its own tasks).

A method a view does not handle is a 405 with ``Allow``, after the object the path names was
looked up in the caller's tenant (the view's ``tenant_object()``): another tenant's id is a 404
whatever the method, as it is for the methods the view handles. A whole number in the path past
what PostgreSQL's bigint holds is a 400 naming it, after authentication.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import DataError
from django.http import Http404
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from rest_framework import exceptions, permissions, status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import exception_handler

from gpuplatform import throttle
from gpuplatform.errors import FieldErrors
from gpuplatform.outage import DATABASE_RETRY_AFTER_S, DATABASE_UNAVAILABLE, database_unavailable
from gpuplatform.query import WholeNumber
from tenants import access
from tenants.access import Caller
from tenants.roles import Action


def request_tenant(request: Request) -> Caller:
    """The caller and the tenant it acts for, as ``tenants.access.caller_for`` resolves them,
    or the API's refusal: 403 when it is a member of no such tenant; 400 when a session user of
    several tenants named none (a script must not act for a tenant it did not choose)."""
    caller = access.caller_for(request)
    if caller is None:
        raise exceptions.NotAuthenticated()
    if caller.tenant is None:
        raise exceptions.PermissionDenied(caller.problem)
    if caller.chosen_by == "first":
        raise exceptions.ValidationError(
            {"tenant": [_("you belong to several tenants: name one with the X-Tenant header")]}
        )
    return caller


def view_action(view, method: str) -> Action:
    """What a request does, in ``tenants.roles`` terms: the view's ``tenant_actions`` name it
    per method; reads need not be named. A write no view names is a bug, not a grant."""
    actions = getattr(view, "tenant_actions", {})
    if method in actions:
        return actions[method]
    if method in permissions.SAFE_METHODS:
        return Action.READ
    raise ImproperlyConfigured(f"{type(view).__name__}.tenant_actions does not name {method}")


def handles(view, method: str) -> bool:
    """Whether ``view`` has a handler for ``method``, as DRF's dispatch decides."""
    name = method.lower()
    return name in view.http_method_names and hasattr(view, name)


_PATH_NUMBER = WholeNumber()
_SCHEMA_NAMES = {"pk": "id"}


def check_path_numbers(view) -> None:
    """400 naming a whole number of the path (``<int:pk>``) that no bigint column holds: the
    URL converter takes any length of digits."""
    for name, value in getattr(view, "kwargs", {}).items():
        if isinstance(value, int):
            try:
                _PATH_NUMBER.run_validation(value)
            except exceptions.ValidationError as exc:
                # Named as the schema names it (drf-spectacular documents ``pk`` as ``id``).
                raise exceptions.ValidationError(
                    {_SCHEMA_NAMES.get(name, name): exc.detail}
                ) from None


class IsTenantMember(permissions.BasePermission):
    """A member of the tenant whose role may do the view's action (``tenants.roles``). For a
    method the view does not handle, and for OPTIONS: 404 when the path names an object the
    caller's tenant does not have (``view.tenant_object()``); then 405 (DRF adds ``Allow``)."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        caller = request_tenant(request)
        check_path_numbers(view)
        handled = handles(view, request.method)
        if not handled or request.method == "OPTIONS":
            tenant_object = getattr(view, "tenant_object", None)
            if tenant_object is not None:
                tenant_object()  # raises Http404 for another tenant's object
        if not handled:
            raise exceptions.MethodNotAllowed(request.method)
        caller.require(view_action(view, request.method))
        return True


class IsOperator(permissions.BasePermission):
    message = gettext_lazy("operators only")

    def has_permission(self, request, view) -> bool:
        allowed = bool(request.user and request.user.is_authenticated and request.user.is_staff)
        if allowed:
            check_path_numbers(view)
        return allowed


def errors_response(errors: dict[str, list[str]], code: int = 400) -> Response:
    return Response({"detail": _summary(errors), "errors": errors}, status=code)


def _summary(errors: dict[str, list[str]]) -> str:
    field, reasons = next(iter(errors.items()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{field}: {reasons[0]}{more}"


def _flatten(data, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error lists and dicts, as {field path: [reasons]}."""
    if isinstance(data, dict):
        flat: dict[str, list[str]] = {}
        for key, value in data.items():
            name = "" if key == "non_field_errors" else str(key)
            flat.update(_flatten(value, f"{prefix}.{name}" if prefix and name else prefix or name))
        return flat
    if isinstance(data, list) and data and all(isinstance(item, (dict, list)) for item in data):
        flat = {}
        for i, item in enumerate(data):
            flat.update(_flatten(item, f"{prefix}[{i}]"))
        return flat
    reasons = [str(item) for item in data] if isinstance(data, list) else [str(data)]
    return {prefix or "request": reasons}


def _raised_by_a_parser(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if isinstance(tb.tb_frame.f_locals.get("self"), BaseParser):
            return True
        tb = tb.tb_next
    return False


def handle_exception(exc, context):
    """Every 4xx answers ``{"detail": "...", "errors": {field: [reasons]}}``; so does a 503
    while the database is unreachable (with Retry-After)."""
    if database_unavailable(exc):
        response = Response({"detail": DATABASE_UNAVAILABLE, "errors": {}}, status=503)
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
        return response
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        refused = _pace_by_address(context["request"])
        if refused is not None:
            return refused
    if isinstance(exc, FieldErrors):
        return errors_response(exc.errors)
    if isinstance(exc, DataError) and "NUL (0x00)" in str(exc):
        # PostgreSQL text cannot hold NUL: a query parameter, path part or related field that
        # carries one is the client's mistake (400), not the server's (500).
        return errors_response({"request": [_("text must not contain NUL (0x00) characters")]})
    if isinstance(exc, RequestDataTooBig):
        # Django would answer its own HTML 400; clients read JSON.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return errors_response({"request": [f"the body is larger than {limit} bytes"]}, code=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(_("not found"))
    if isinstance(exc, RecursionError) and _raised_by_a_parser(exc):
        # json.loads refuses "[[[[...]]]]" this way; it is bad input, not a server fault.
        exc = exceptions.ParseError(_("the request body is nested too deeply"))
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(response.data)
        response.data = {"detail": _summary(errors), "errors": errors}
    elif isinstance(exc, exceptions.ParseError):
        # A body that cannot be read at all: the field at fault is the request itself.
        errors = {"request": [str(exc.detail)]}
        response.data = {"detail": _summary(errors), "errors": errors}
    else:
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        response.data = {"detail": str(detail), "errors": {}}
    if response.status_code == status.HTTP_429_TOO_MANY_REQUESTS and "Retry-After" not in response:
        response["Retry-After"] = "1"
    return response


def _pace_by_address(request) -> Response | None:
    """Requests without a valid token are paced per client address (API_ANON_THROTTLE_RATE):
    a 429 instead of the 401 once an address is over its rate, and from then on this process
    refuses that address's tokenless requests before any work (gpuplatform.throttle)."""
    address = request.META.get("REMOTE_ADDR", "")
    rate = settings.API_ANON_THROTTLE_RATE
    verdict = throttle.consume(throttle.address_key(address), rate)
    if verdict.allowed:
        return None
    throttle.PACER.refused(throttle.address_key(address), verdict, rate)
    body, retry_after = throttle.too_many_requests_body(verdict.wait_s)
    response = Response(json.loads(body), status=status.HTTP_429_TOO_MANY_REQUESTS)
    response["Retry-After"] = str(retry_after)
    return response
