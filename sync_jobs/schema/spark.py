"""RowSchema -> Spark StructType (the same types the Arrow schema gives, as Spark sees them)."""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from sync_jobs.schema.arrow import arrow_schema
from sync_jobs.schema.types import RowSchema


def spark_schema(schema: RowSchema) -> StructType:
    return from_arrow_schema(arrow_schema(schema))
