"""``Authorization: Bearer <token>`` for the API, answering 401 on anything wrong."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Model
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from gpuplatform.db import server_bound_cursor
from tenants import tokens
from tenants.models import ApiToken, Membership, Tenant

# Writing last_used_at on every request would turn each read into a write; a minute is
# precise enough to tell an operator whether a token is still in use.
LAST_USED_PRECISION = timedelta(minutes=1)

# Whether a token's parent, or the parent's parent and so on, is revoked or expired: a
# correlated recursive CTE, so authentication stays one query however deep the chain. UNION
# (not UNION ALL) ends the walk even on a cycle, which the API cannot create.
DEAD_ANCESTOR_SQL = """EXISTS (
    WITH RECURSIVE ancestor (id, parent_id, revoked_at, expires_at) AS (
        SELECT up.id, up.parent_id, up.revoked_at, up.expires_at
        FROM tenants_apitoken up WHERE up.id = tenants_apitoken.parent_id
        UNION
        SELECT up.id, up.parent_id, up.revoked_at, up.expires_at
        FROM tenants_apitoken up JOIN ancestor ON up.id = ancestor.parent_id
    )
    SELECT 1 FROM ancestor WHERE revoked_at IS NOT NULL OR expires_at <= %s
)"""


class TokenContext:
    """What `request.auth` holds for token requests: the token and the caller's tenant role."""

    def __init__(self, token: ApiToken, role: str) -> None:
        self.token = token
        self.tenant = token.tenant
        self.role = role


def _columns(model: type[Model]) -> list[str]:
    table = model._meta.db_table
    return [f'"{table}"."{field.column}"' for field in model._meta.concrete_fields]


@functools.cache
def _token_sql() -> str:
    """One statement: the token, its user and tenant, the owner's role in that tenant, and
    whether any token above it (the one that made it, and so on) is revoked or expired.

    Written as SQL, not as an ORM query: every API request authenticates, and compiling the
    equivalent queryset (a subquery, a raw expression, two joins) cost the web process several
    times what PostgreSQL spends running it. The text is built once, from the models' own table
    and column names."""
    user_model = get_user_model()
    token, user, tenant = ApiToken._meta.db_table, user_model._meta.db_table, Tenant._meta.db_table
    membership = Membership._meta.db_table
    columns = ", ".join(_columns(ApiToken) + _columns(user_model) + _columns(Tenant))
    return (
        f"SELECT {columns}, "  # noqa: S608 - names from the models, no request data
        f'(SELECT m.role FROM "{membership}" m WHERE m.user_id = "{token}".user_id '
        f'AND m.tenant_id = "{token}".tenant_id LIMIT 1), '
        f"{DEAD_ANCESTOR_SQL} "
        f'FROM "{token}" JOIN "{user}" ON "{user}".id = "{token}".user_id '
        f'JOIN "{tenant}" ON "{tenant}".id = "{token}".tenant_id '
        f'WHERE "{token}".prefix = %s'
    )


def _token_by_prefix(prefix: str, now: datetime) -> ApiToken | None:
    """The token with its ``user`` and ``tenant`` loaded, and ``role`` and ``ancestor_dead``
    set as the ORM's annotations would; None when no token has this prefix."""
    with server_bound_cursor() as cursor:
        cursor.execute(_token_sql(), [now, prefix])
        row = cursor.fetchone()
    if row is None:
        return None
    user_model = get_user_model()
    models = (ApiToken, user_model, Tenant)
    instances = []
    start = 0
    for model in models:
        fields = model._meta.concrete_fields
        values = row[start : start + len(fields)]
        instances.append(model.from_db(connection.alias, [f.attname for f in fields], values))
        start += len(fields)
    token, user, tenant = instances
    token.user, token.tenant = user, tenant
    token.role, token.ancestor_dead = row[start], row[start + 1]
    return token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header: expected 'Bearer <token>'")
        try:
            secret = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Authorization header: invalid token") from None
        return self.authenticate_token(secret)

    def authenticate_token(self, secret: str):
        prefix = tokens.prefix_of(secret)
        now = timezone.now()
        token = _token_by_prefix(prefix, now) if prefix else None
        if token is None or not tokens.matches(secret, token.key_hash):
            raise exceptions.AuthenticationFailed("invalid token")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("token revoked")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("token expired")
        if token.ancestor_dead:
            raise exceptions.AuthenticationFailed(
                "token revoked: the token that created it was revoked or expired"
            )
        if not token.user.is_active or not token.tenant.is_active:
            raise exceptions.AuthenticationFailed("user or tenant inactive")
        if token.role is None:
            raise exceptions.AuthenticationFailed("token owner is no longer a member of the tenant")
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_PRECISION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, TokenContext(token, token.role)

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with WWW-Authenticate) instead of 403.
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "gpup_... API token"}
