"""API endpoints about the caller, its tenant's quota and usage, its tokens; tenant admins'
management of members and tokens; and operators' management of tenants, members and quotas."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform import query
from gpuplatform.api import IsOperator, IsTenantMember, errors_response, request_tenant
from gpuplatform.query import WholeNumber
from gpuplatform.serializers import ModelCleanSerializer
from scheduling import quotas, usage
from tenants import selectors, services
from tenants.authentication import TokenContext
from tenants.models import ApiToken, Membership, Quota, Role, Tenant
from tenants.roles import Action

MAX_USAGE_DAYS = 366


class MembershipOut(serializers.Serializer):
    tenant = serializers.CharField()
    role = serializers.CharField()


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    is_operator = serializers.BooleanField()
    tenant = serializers.CharField(allow_null=True, help_text="The token's tenant, if any.")
    token = serializers.CharField(allow_null=True, help_text="The token's visible prefix.")
    memberships = MembershipOut(many=True)


class MeView(APIView):
    """Who the caller is: user, operator flag, the token's tenant and all memberships."""

    @extend_schema(responses=MeOut)
    def get(self, request: Request) -> Response:
        context = request.auth if isinstance(request.auth, TokenContext) else None
        memberships = request.user.memberships.select_related("tenant")
        return Response(
            MeOut(
                {
                    "username": request.user.get_username(),
                    "is_operator": request.user.is_staff,
                    "tenant": context.tenant.name if context else None,
                    "token": context.token.prefix if context else None,
                    "memberships": [{"tenant": m.tenant.name, "role": m.role} for m in memberships],
                }
            ).data
        )


# --- Tokens ----------------------------------------------------------------------------------


class TokenOut(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.name", read_only=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "tenant",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
            "parent",
        ]
        read_only_fields = fields


class TokenIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False)


class TokenCreated(TokenOut):
    token = serializers.CharField(help_text="The secret: shown this once, stored only hashed.")

    class Meta(TokenOut.Meta):
        fields = [*TokenOut.Meta.fields, "token"]
        read_only_fields = fields


class TokenList(generics.ListAPIView):
    """Your API tokens in this tenant; create one (its secret is shown once). A token acts with
    your role, so viewers may have them too."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"POST": Action.OWN_TOKENS}
    serializer_class = TokenOut

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        tenant = request_tenant(self.request).tenant
        return selectors.token_list(tenant=tenant, user=self.request.user)

    @extend_schema(request=TokenIn, responses={201: TokenCreated})
    def post(self, request: Request) -> Response:
        incoming = TokenIn(data=request.data)
        incoming.is_valid(raise_exception=True)
        days = incoming.validated_data.get("expires_in_days")
        expires_at = timezone.now() + timedelta(days=days) if days else None
        # A token made by a token is bound to it (expires with it, dies with it).
        parent = request.auth.token if isinstance(request.auth, TokenContext) else None
        if parent and parent.expires_at and expires_at and expires_at > parent.expires_at:
            return errors_response(
                {"expires_in_days": [
                    f"must not outlive the token making this request: it expires at "
                    f"{parent.expires_at.isoformat()}"
                ]}
            )  # fmt: skip
        token, secret = services.apitoken_create(
            user=request.user,
            tenant=request_tenant(request).tenant,
            name=incoming.validated_data["name"],
            expires_at=expires_at,
            parent=parent,
        )
        token.token = secret
        return Response(TokenCreated(token).data, status=status.HTTP_201_CREATED)


class TokenRevoke(APIView):
    """Revoke one of your tokens; it is refused from the next request on."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"DELETE": Action.OWN_TOKENS}

    def tokens(self):
        """The caller's own token of the path, or 404 (whatever the method: IsTenantMember)."""
        tenant = request_tenant(self.request).tenant
        tokens = selectors.token_list(tenant=tenant, user=self.request.user)
        tokens = tokens.filter(pk=self.kwargs["pk"])
        get_object_or_404(tokens)
        return tokens

    tenant_object = tokens

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        services.apitokens_revoke(tokens=self.tokens())
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Quota and usage -------------------------------------------------------------------------


class LimitsOut(serializers.Serializer):
    pool = serializers.CharField(allow_null=True)
    max_gpus = serializers.IntegerField(allow_null=True)
    max_gpu_memory_mb = serializers.IntegerField(allow_null=True)
    max_running_tasks = serializers.IntegerField(allow_null=True)
    max_queued_tasks = serializers.IntegerField(allow_null=True)
    max_priority = serializers.IntegerField()
    fair_share_weight = serializers.FloatField()


QuotaOut = inline_serializer(
    "QuotaOut",
    {
        "tenant": serializers.CharField(),
        "limits": LimitsOut(many=True),
        "in_use": inline_serializer(
            "InUse",
            {
                "gpus": serializers.FloatField(),
                "gpu_memory_mb": serializers.IntegerField(),
                "running_tasks": serializers.IntegerField(),
                "queued_tasks": serializers.IntegerField(),
            },
        ),
        "fair_share": inline_serializer(
            "FairShare",
            {
                "recent_gpus": serializers.FloatField(),
                "weight": serializers.FloatField(),
                "half_life_s": serializers.IntegerField(),
            },
        ),
    },
)


class QuotaView(APIView):
    """Your tenant's limits, what it uses now, and its fair-share standing (tenant admins)."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"GET": Action.VIEW_QUOTA}

    @extend_schema(responses=QuotaOut)
    def get(self, request: Request) -> Response:
        return Response(usage.quota_summary(tenant=request_tenant(request).tenant))


UsageOut = inline_serializer(
    "UsageOut",
    {
        "tenant": serializers.CharField(),
        "days": inline_serializer(
            "UsageDay",
            {"day": serializers.DateField(), "gpu_hours": serializers.FloatField()},
            many=True,
        ),
        "total_gpu_hours": serializers.FloatField(),
    },
)


class UsageQuery(serializers.Serializer):
    days = WholeNumber(minimum=1, maximum=MAX_USAGE_DAYS, default=30)


class UsageView(APIView):
    """GPU-hours your tenant used per day (shared GPUs count their fraction)."""

    permission_classes = [IsTenantMember]

    @extend_schema(parameters=[UsageQuery], responses=UsageOut)
    def get(self, request: Request) -> Response:
        asked = query.parse(UsageQuery, request.query_params)
        tenant = request_tenant(request).tenant
        days = usage.usage_per_day(tenant=tenant, days=asked["days"])
        return Response(
            {
                "tenant": tenant.name,
                "days": days,
                "total_gpu_hours": round(sum(d["gpu_hours"] for d in days), 3),
            }
        )


# --- Tenant admins: members and every token of the tenant ----------------------------------------


class TenantMemberOut(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = fields


class TenantMemberIn(serializers.Serializer):
    username = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.filter(is_active=True)
    )
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class TenantRoleIn(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


def _membership_answer(call) -> Response | None:
    """Run a membership change; the last admin's removal or demotion answers 409."""
    try:
        call()
    except services.LastAdmin as exc:
        return errors_response({"role": [str(exc)]}, code=409)
    return None


class TenantMemberList(generics.ListAPIView):
    """Your tenant's members and their roles; add a user (or change its role). Tenant admins."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"GET": Action.MANAGE_MEMBERS, "POST": Action.MANAGE_MEMBERS}
    serializer_class = TenantMemberOut

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Membership.objects.none()
        return selectors.member_list(tenant=request_tenant(self.request).tenant)

    @extend_schema(request=TenantMemberIn, responses={201: TenantMemberOut})
    def post(self, request: Request) -> Response:
        incoming = TenantMemberIn(data=request.data)
        incoming.is_valid(raise_exception=True)
        tenant = request_tenant(request).tenant
        user, role = incoming.validated_data["username"], incoming.validated_data["role"]
        refused = _membership_answer(
            lambda: services.membership_change(tenant=tenant, user=user, role=role)
        )
        if refused:
            return refused
        membership = selectors.member_get(tenant=tenant, username=user.username)
        return Response(TenantMemberOut(membership).data, status=status.HTTP_201_CREATED)


class TenantMemberDetail(APIView):
    """One member of your tenant: change its role or remove it (its tokens here are revoked).
    Tenant admins; the tenant always keeps one admin."""

    permission_classes = [IsTenantMember]
    tenant_actions = {
        "GET": Action.MANAGE_MEMBERS,
        "PATCH": Action.MANAGE_MEMBERS,
        "DELETE": Action.MANAGE_MEMBERS,
    }

    def membership(self, username: str) -> Membership:
        return selectors.member_get(tenant=request_tenant(self.request).tenant, username=username)

    def tenant_object(self) -> Membership:
        """404 for someone not in the caller's tenant, whatever the method (IsTenantMember)."""
        return self.membership(self.kwargs["username"])

    @extend_schema(responses=TenantMemberOut)
    def get(self, request: Request, username: str) -> Response:
        return Response(TenantMemberOut(self.membership(username)).data)

    @extend_schema(request=TenantRoleIn, responses={200: TenantMemberOut, 409: OpenApiTypes.OBJECT})
    def patch(self, request: Request, username: str) -> Response:
        membership = self.membership(username)
        incoming = TenantRoleIn(data=request.data)
        incoming.is_valid(raise_exception=True)
        role = incoming.validated_data["role"]
        refused = _membership_answer(
            lambda: services.membership_change(
                tenant=membership.tenant, user=membership.user, role=role
            )
        )
        if refused:
            return refused
        return Response(TenantMemberOut(self.membership(username)).data)

    @extend_schema(request=None, responses={204: None, 409: OpenApiTypes.OBJECT})
    def delete(self, request: Request, username: str) -> Response:
        membership = self.membership(username)
        refused = _membership_answer(lambda: services.membership_remove(membership=membership))
        return refused or Response(status=status.HTTP_204_NO_CONTENT)


class TenantTokenOut(TokenOut):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta(TokenOut.Meta):
        fields = [*TokenOut.Meta.fields, "username"]
        read_only_fields = fields


class TenantTokenList(generics.ListAPIView):
    """Every API token of your tenant, whoever holds it (tenant admins)."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"GET": Action.MANAGE_TOKENS}
    serializer_class = TenantTokenOut

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return selectors.token_list(tenant=request_tenant(self.request).tenant, user=None)


class TenantTokenRevoke(APIView):
    """Revoke any token of your tenant, a teammate's leaked one say (tenant admins)."""

    permission_classes = [IsTenantMember]
    tenant_actions = {"DELETE": Action.MANAGE_TOKENS}

    def tokens(self):
        """The tenant's token of the path, or 404 (whatever the method: IsTenantMember)."""
        tenant = request_tenant(self.request).tenant
        tokens = selectors.token_list(tenant=tenant, user=None).filter(pk=self.kwargs["pk"])
        get_object_or_404(tokens)
        return tokens

    tenant_object = tokens

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        services.apitokens_revoke(tokens=self.tokens())
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- Operators ---------------------------------------------------------------------------------


class TenantOut(ModelCleanSerializer):
    class Meta:
        model = Tenant
        fields = [
            "id",
            "name",
            "display_name",
            "description",
            "is_active",
            "unix_user",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]


class OperatorTenantList(generics.ListCreateAPIView):
    """All tenants; create one."""

    permission_classes = [IsOperator]
    serializer_class = TenantOut
    queryset = Tenant.objects.all()

    def perform_create(self, serializer):
        serializer.instance = services.tenant_create(**serializer.validated_data)


class OperatorTenantDetail(generics.RetrieveUpdateAPIView):
    """One tenant: rename its display name, deactivate it (its tokens stop working)."""

    permission_classes = [IsOperator]
    serializer_class = TenantOut
    queryset = Tenant.objects.all()
    lookup_field = "name"


class MemberOut(serializers.ModelSerializer):
    username = serializers.SlugRelatedField(
        source="user", slug_field="username", queryset=get_user_model().objects.all()
    )

    class Meta:
        model = Membership
        fields = ["id", "username", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


class OperatorMemberList(generics.ListCreateAPIView):
    """A tenant's members; add (or change the role of) one."""

    permission_classes = [IsOperator]
    serializer_class = MemberOut

    def tenant(self) -> Tenant:
        return get_object_or_404(Tenant, name=self.kwargs["name"])

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Membership.objects.none()
        return selectors.member_list(tenant=self.tenant())

    @extend_schema(responses={201: MemberOut, 409: OpenApiTypes.OBJECT})
    def post(self, request: Request, *args, **kwargs) -> Response:
        # The tenant's last admin keeps its role here too (409), as in the tenant admins' API.
        try:
            return super().post(request, *args, **kwargs)
        except services.LastAdmin as exc:
            return errors_response({"role": [str(exc)]}, code=409)

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.membership_change(
            user=data["user"], tenant=self.tenant(), role=data.get("role", Role.MEMBER)
        )


class QuotaSerializer(ModelCleanSerializer):
    """Quotas are checked by the model (Quota.validate_constraints), as in the admin, and saved
    by the quota service (scheduling.quotas), as the admin saves them."""

    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.all())
    pool = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Quota._meta.get_field("pool").related_model.objects.all(),
        allow_null=True,
        required=False,
    )

    class Meta:
        model = Quota
        fields = [
            "id",
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
        read_only_fields = ["id", "updated_at"]

    def create(self, validated_data) -> Quota:
        return quotas.quota_set(quota=Quota(**validated_data))

    def update(self, instance: Quota, validated_data) -> Quota:
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return quotas.quota_set(quota=instance)


class OperatorQuotaList(generics.ListCreateAPIView):
    """All quotas; create one (cluster-wide when pool is empty)."""

    permission_classes = [IsOperator]
    serializer_class = QuotaSerializer
    queryset = Quota.objects.select_related("tenant", "pool")


class OperatorQuotaDetail(generics.RetrieveUpdateDestroyAPIView):
    """One quota: change or remove it; waiting tasks are reconsidered at once."""

    permission_classes = [IsOperator]
    serializer_class = QuotaSerializer
    queryset = Quota.objects.select_related("tenant", "pool")

    def perform_destroy(self, instance):
        quotas.quota_delete(quota=instance)
