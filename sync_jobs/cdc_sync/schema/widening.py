"""Which column type changes are widenings (evolve applies them; anything else is incompatible).

The one home of the rule: the job's schema-change policy decides with it, and the targets then
only conform their stored types to the wanted ones.
"""

from __future__ import annotations

from cdc_sync.core.types import ColumnType, TypeKind

WIDENINGS = {
    (TypeKind.INT16, TypeKind.INT32),
    (TypeKind.INT16, TypeKind.INT64),
    (TypeKind.INT32, TypeKind.INT64),
    (TypeKind.FLOAT32, TypeKind.FLOAT64),
}


def widens(before: ColumnType, after: ColumnType) -> bool:
    """int2 -> int4 -> int8, float4 -> float8, a numeric gaining precision at the same scale."""
    if (before.kind, after.kind) in WIDENINGS:
        return True
    return (
        before.kind is after.kind is TypeKind.DECIMAL
        and before.scale is not None
        and before.scale == after.scale
        and (after.precision or 0) >= (before.precision or 0)
    )
