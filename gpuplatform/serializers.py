"""Serializer pieces shared by the apps."""

from __future__ import annotations

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.validators import UniqueValidator


class ModelCleanSerializer(serializers.ModelSerializer):
    """A model serializer whose rules are the model's own: ``full_clean()`` (field validators,
    ``clean()``, uniqueness, constraints), as the admin's and the portal's forms run it. A value
    the API refuses, the admin refuses too, in the same words.

    DRF's copies of the uniqueness checks are dropped (their words differ from Django's); the
    model checks uniqueness itself.
    """

    def build_standard_field(self, field_name, model_field):
        field_class, kwargs = super().build_standard_field(field_name, model_field)
        if "validators" in kwargs:
            kwargs["validators"] = [
                v for v in kwargs["validators"] if not isinstance(v, UniqueValidator)
            ]
        return field_class, kwargs

    def get_validators(self) -> list:
        return []  # unique-together and the like: full_clean() checks them

    def validate(self, attrs):
        attrs = super().validate(attrs)
        instance = copy.copy(self.instance) if self.instance is not None else self.Meta.model()
        for name, value in attrs.items():
            setattr(instance, name, value)
        try:
            instance.full_clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(serializers.as_serializer_error(exc)) from None
        return attrs
