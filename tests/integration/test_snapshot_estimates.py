"""The snapshot progress view's totals: the catalog's estimate, or an exact count for a small
table never analyzed."""

from __future__ import annotations

import psycopg
import pytest

from cdc_sync.core.model import TableId
from cdc_sync.job.observe.console import catalog_estimates
from tests.pg import private_database

pytestmark = pytest.mark.integration


def test_estimates_use_reltuples_and_count_small_unanalyzed_tables(pg_url: str) -> None:
    with (
        private_database(pg_url, "estimates") as url,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        conn.execute("CREATE TABLE public.fresh (id int PRIMARY KEY)")
        conn.execute("INSERT INTO public.fresh SELECT generate_series(1, 25)")
        conn.execute('CREATE TABLE public."Analyzed" (id int PRIMARY KEY)')
        conn.execute('INSERT INTO public."Analyzed" SELECT generate_series(1, 40)')
        conn.execute('ANALYZE public."Analyzed"')
        estimates = catalog_estimates(
            conn,
            [TableId("public", "fresh"), TableId("public", "Analyzed"), TableId("public", "gone")],
        )
    assert estimates == {
        TableId("public", "fresh"): 25,
        TableId("public", "Analyzed"): 40,
        TableId("public", "gone"): None,
    }
