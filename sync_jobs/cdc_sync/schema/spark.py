"""RowSchema -> Spark StructType (the same types the Arrow schema gives, as Spark sees them)."""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from cdc_sync.core.types import RowSchema
from cdc_sync.schema.arrow import arrow_schema


def spark_schema(schema: RowSchema) -> StructType:
    return from_arrow_schema(arrow_schema(schema))
