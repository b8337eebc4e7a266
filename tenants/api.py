"""API endpoints about the caller."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.authentication import TokenContext


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
