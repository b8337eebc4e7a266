"""Test data builders (factory-boy), one per model the tests create directly."""

from __future__ import annotations

import factory
from django.contrib.auth.models import User

from nodeagent.inventory import simulated_uuid
from scheduling.models import GPU, Node, Pool, Task
from tenants.models import Membership, Role, Tenant


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"tenant-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


class PoolFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Pool
        django_get_or_create = ("name",)

    name = "default"


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n}")
    pool = factory.SubFactory(PoolFactory)
    backend = "simulated"


def make_gpus(node: Node, *, count: int, memory_mb: int = 24576) -> list[GPU]:
    return [
        GPU.objects.create(
            node=node,
            index=i,
            uuid=simulated_uuid(node.name, i),
            model="NVIDIA GeForce RTX 4090",
            gpu_type="rtx4090-24g",
            memory_mb=memory_mb,
        )
        for i in range(count)
    ]


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"task-{n}")
    command = "python train.py"


class AllocationFactory(factory.django.DjangoModelFactory):
    """A shared slice of a GPU by default: pass ``exclusive=True`` and the GPU's memory for all."""

    class Meta:
        model = "scheduling.Allocation"

    task = factory.SubFactory(TaskFactory)
    attempt = 1
    gpu = None  # always passed: a GPU belongs to a node the test built
    memory_mb = 1024
    exclusive = False


class TaskEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "scheduling.TaskEvent"

    task = factory.SubFactory(TaskFactory)
    from_state = "pending"
    to_state = "scheduled"
    reason = "placed"


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = "tenants.Quota"

    tenant = factory.SubFactory(TenantFactory)
    pool = None
    max_gpus = 4


def make_token(*, user: User, tenant: Tenant, name: str = "token", prefix: str = ""):
    """An ApiToken row with a given (or random) prefix, without the membership check of the
    service: for tests of the table itself."""
    from tenants import tokens
    from tenants.models import ApiToken

    secret, random_prefix = tokens.generate()
    return ApiToken.objects.create(
        user=user,
        tenant=tenant,
        name=name,
        prefix=prefix or random_prefix,
        key_hash=tokens.hash_token(secret),
    )
