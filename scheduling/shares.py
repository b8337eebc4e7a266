"""The share of a card an allocation holds, for SQL: the twin of ``policy.card_share`` (which the
pure policy core uses), written once here for raw SQL and the ORM alike. Quota use, fair share
and usage reports all count shared GPUs through it; a test checks it agrees with the core."""

from __future__ import annotations

from django.db.models import F, FloatField, Func


def card_share_sql(*, exclusive: str, memory_mb: str, card_memory_mb: str) -> str:
    """The formula over three SQL expressions (columns, usually): 1 when exclusive, else the
    reserved memory over the card's (a card of 0 MiB counts as 1, as in the core)."""
    return (
        f"(CASE WHEN {exclusive} THEN 1.0::float "
        f"ELSE {memory_mb}::float / GREATEST({card_memory_mb}, 1) END)"
    )


def allocation_share_sql(allocation: str = "a", gpu: str = "g") -> str:
    """For raw SQL that joins ``scheduling_allocation`` (as ``allocation``) to ``scheduling_gpu``
    (as ``gpu``)."""
    return card_share_sql(
        exclusive=f"{allocation}.exclusive",
        memory_mb=f"{allocation}.memory_mb",
        card_memory_mb=f"{gpu}.memory_mb",
    )


class CardShare(Func):
    """The same formula as an ORM expression; by default over an Allocation's own fields."""

    output_field = FloatField()

    def __init__(
        self,
        exclusive: str = "exclusive",
        memory_mb: str = "memory_mb",
        card_memory_mb: str = "gpu__memory_mb",
    ) -> None:
        super().__init__(F(exclusive), F(memory_mb), F(card_memory_mb))

    def as_sql(self, compiler, connection, **extra_context):
        parts, params = [], []
        for expression in self.get_source_expressions():
            sql, more = compiler.compile(expression)
            parts.append(sql)
            params.extend(more)
        exclusive, memory_mb, card_memory_mb = parts
        sql = card_share_sql(
            exclusive=exclusive, memory_mb=memory_mb, card_memory_mb=card_memory_mb
        )
        return sql, params
