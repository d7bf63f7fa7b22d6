"""The setup SQL `cdc-sync init` writes (and `--apply` runs): the heartbeat and signal tables,
the publication, the connector's role and, with partitioned tables, the event trigger that keeps
their sinks exact when partitions are attached, detached or dropped. Every name is quoted by
`psycopg.sql` (a quote or a dot in a name is only a character); pure, deterministic.

Partitions (observed on real Debezium, tests/integration/test_debezium_partitions.py): with
`publish_via_partition_root` every change of a partition arrives as a change of its root, a
partition created while streaming included. But ATTACH PARTITION brings rows without a change
event, and DETACH or DROP of a partition (or TRUNCATE of one) removes rows without one. So an
event trigger compares each captured root's partitions with those it recorded, after every
CREATE, ALTER or DROP TABLE: a new partition holding rows gets an incremental snapshot of the
root narrowed to the partition's constraint (its rows, fenced by version like any snapshot
row); a partition gone gets a blocking snapshot of the root, whose end removes from every sink
the rows the root no longer holds (`on_snapshot_end: sweep`). Both are Debezium signals written
to the connector's signal table in the DDL's own transaction. Only a superuser may create an
event trigger; without one the setup says what to run by hand instead.
"""

from __future__ import annotations

from psycopg import sql

from cdc_sync.connectors.init.render import Plan, left_out
from cdc_sync.core.model import TableId


def setup_sql(plan: Plan) -> str:
    role = sql.Identifier(plan.role)
    schemas = sorted({t.schema for t in plan.captured})
    heartbeat, signal = _name(plan.heartbeat), _name(plan.signal)
    publication = sql.Identifier(plan.publication)
    options = "publish_via_partition_root = true"
    if plan.survey.publishes_generated:  # Postgres 18: streamed changes carry them too
        options += ", publish_generated_columns = stored"
    values = {
        "role": role,
        "role_name": sql.Literal(plan.role),
        "heartbeat": heartbeat,
        "signal": signal,
        "publication": publication,
        "publication_name": sql.Literal(plan.publication),
        "published": sql.SQL(", ").join(_name(t) for t in plan.captured),
        "routed": sql.SQL(", ").join(_name(f.table) for f in plan.survey.captured),
        "options": sql.SQL(options),  # fixed text, no names
        "database": sql.Identifier(plan.survey.database),
        "schemas": sql.SQL(", ").join(sql.Identifier(s) for s in schemas),
    }
    lines = [
        f"-- Setup for cdc-sync connector {plan.name} on database {plan.survey.database}, written",
        "-- by `cdc-sync init` (`--apply` runs it). Idempotent: safe to run again. Run it as the",
        "-- tables' owner or a superuser.",
        *left_out("-- ", plan.survey.flags),
        "",
        "-- The connector's heartbeat.action.query upserts its row every heartbeat.interval.ms:",
        "-- its changes carry WAL positions, so the slot and the job's watermarks advance while",
        "-- the other tables are idle.",
        "CREATE TABLE IF NOT EXISTS {heartbeat} (",
        "    connector  text PRIMARY KEY,",
        "    beat_at    timestamptz NOT NULL",
        ");",
        "",
        "-- Debezium's signal table: incremental snapshots (`cdc-sync connectors snapshot`,",
        "-- `cdc-sync repair`) are requested here and read back from the WAL.",
        "CREATE TABLE IF NOT EXISTS {signal} (",
        "    id    varchar(64) PRIMARY KEY,",
        "    type  varchar(32) NOT NULL,",
        "    data  varchar(2048)",
        ");",
        "",
        "-- The publication: exactly the captured tables (the connector never alters it). A",
        "-- partitioned table is published through its root: its partitions' changes arrive as",
        "-- the root's, on the root's topic.",
        "DO $$",
        "BEGIN",
        "    IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {publication_name}) THEN",
        "        ALTER PUBLICATION {publication} SET TABLE {published};",
        "        ALTER PUBLICATION {publication} SET ({options});",
        "    ELSE",
        "        CREATE PUBLICATION {publication} FOR TABLE {published} WITH ({options});",
        "    END IF;",
        "END $$;",
        "",
        "-- The role the connector and the job use: REPLICATION to stream (and create its slot),",
        "-- SELECT on the captured tables (snapshots, the TOAST fill, verify and repair read",
        "-- them), the heartbeat upsert, and INSERT on the signal table (Debezium's snapshot",
        "-- windows, `connectors snapshot` and repair signals). Nothing else.",
        "DO $$",
        "BEGIN",
        "    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role_name}) THEN",
        "        CREATE ROLE {role} LOGIN REPLICATION;",
        "    END IF;",
        "END $$;",
        "-- Give it a password for connections that need one: ALTER ROLE {role} PASSWORD '...';",
        "GRANT CONNECT ON DATABASE {database} TO {role};",
        "GRANT USAGE ON SCHEMA {schemas} TO {role};",
        "GRANT SELECT ON TABLE {routed} TO {role};",
        "GRANT SELECT, INSERT, UPDATE ON TABLE {heartbeat} TO {role};",
        "GRANT SELECT, INSERT ON TABLE {signal} TO {role};",
    ]
    text = sql.SQL("\n".join(lines) + "\n").format(**values).as_string()
    roots = [f.table for f in plan.survey.partitioned]
    return text + (partition_trigger(plan, roots) if roots else "")


def _name(table: TableId) -> sql.Identifier:
    return sql.Identifier(table.schema, table.table)


def trigger_name(connector: str) -> str:
    """The event trigger's name (event triggers are per database), its function's and that of
    the table recording each root's partitions."""
    return f"cdc_sync_{connector}_partitions"


def partitions_table(plan: Plan) -> TableId:
    return TableId(plan.survey.control_schema, trigger_name(plan.name))


def partition_trigger(plan: Plan, roots: list[TableId]) -> str:
    """The partitions each captured root has, recorded, and the event trigger that signals
    Debezium when they change (module docstring)."""
    state = _name(partitions_table(plan))
    function = sql.Identifier(plan.survey.control_schema, trigger_name(plan.name))
    values = {
        "state": state,
        "function": function,
        "trigger": sql.Identifier(trigger_name(plan.name)),
        "signal": _name(plan.signal),
        "roots": sql.SQL(", ").join(
            sql.SQL("({}, {})").format(sql.Literal(_name(root).as_string()), sql.Literal(str(root)))
            for root in roots
        ),
        "hint": sql.Literal(
            "cdc-sync: no event trigger (only a superuser may create one): after ATTACH "
            "PARTITION run `cdc-sync connectors snapshot --table <root>`; after DETACH, DROP or "
            "TRUNCATE of a partition run `cdc-sync repair --table <root>`"
        ),
    }
    lines = [
        "",
        "-- Partitioned tables: ATTACH PARTITION brings rows, DETACH or DROP of a partition takes",
        "-- rows away, without a change event. The event trigger below compares each captured",
        "-- root's partitions with those recorded here after every CREATE, ALTER and DROP TABLE,",
        "-- and signals Debezium in the DDL's own transaction: an incremental snapshot of the",
        "-- root narrowed to a new partition that holds rows; a blocking snapshot of the root",
        "-- when one left it (its end removes the rows the root no longer holds from every",
        "-- sink; streaming waits while it reads the root). TRUNCATE of a single partition fires",
        "-- no event trigger: truncate the root, or run `cdc-sync repair` after it.",
        "CREATE TABLE IF NOT EXISTS {state} (",
        "    root  text NOT NULL,",
        "    leaf  oid NOT NULL,",
        "    PRIMARY KEY (root, leaf)",
        ");",
        "DELETE FROM {state};",
        "INSERT INTO {state} (root, leaf)",
        "    SELECT r.collection, t.relid FROM (VALUES {roots}) AS r(name, collection),"
        "        LATERAL pg_partition_tree(r.name::regclass) t WHERE t.isleaf;",
        "",
        "CREATE OR REPLACE FUNCTION {function}() RETURNS event_trigger",
        "LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$",
        "DECLARE",
        "    r record;",
        "    leaf record;",
        "    gone boolean;",
        "    has_rows boolean;",
        "BEGIN",
        "    FOR r IN SELECT * FROM (VALUES {roots}) AS v(name, collection) LOOP",
        "        CONTINUE WHEN to_regclass(r.name) IS NULL;",
        "        SELECT EXISTS (",
        "            SELECT 1 FROM {state} s WHERE s.root = r.collection AND s.leaf NOT IN",
        "                (SELECT t.relid::oid FROM pg_partition_tree(r.name::regclass) t)",
        "        ) INTO gone;",
        "        IF gone THEN",
        "            INSERT INTO {signal} (id, type, data) VALUES (",
        "                'cdc-sync-partitions-' || gen_random_uuid(), 'execute-snapshot',",
        "                json_build_object('type', 'blocking',",
        "                                  'data-collections', json_build_array(r.collection)));",
        "        ELSE",
        "            FOR leaf IN",
        "                SELECT t.relid FROM pg_partition_tree(r.name::regclass) t",
        "                WHERE t.isleaf AND t.relid::oid NOT IN",
        "                    (SELECT s.leaf FROM {state} s WHERE s.root = r.collection)",
        "            LOOP",
        "                EXECUTE format('SELECT EXISTS (SELECT 1 FROM %s)', leaf.relid)",
        "                    INTO has_rows;",
        "                CONTINUE WHEN NOT has_rows;",
        "                INSERT INTO {signal} (id, type, data) VALUES (",
        "                    'cdc-sync-partitions-' || gen_random_uuid(), 'execute-snapshot',",
        "                    json_build_object(",
        "                        'type', 'incremental',",
        "                        'data-collections', json_build_array(r.collection),",
        "                        'additional-conditions', json_build_array(json_build_object(",
        "                            'data-collection', r.collection,",
        "                            'filter', pg_get_partition_constraintdef(leaf.relid)))));",
        "            END LOOP;",
        "        END IF;",
        "        DELETE FROM {state} s WHERE s.root = r.collection;",
        "        INSERT INTO {state} (root, leaf)",
        "            SELECT r.collection, t.relid FROM pg_partition_tree(r.name::regclass) t",
        "            WHERE t.isleaf;",
        "    END LOOP;",
        "END",
        "$fn$;",
        "",
        "DO $$",
        "BEGIN",
        "    DROP EVENT TRIGGER IF EXISTS {trigger};",
        "    CREATE EVENT TRIGGER {trigger} ON ddl_command_end",
        "        WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE', 'DROP TABLE')",
        "        EXECUTE FUNCTION {function}();",
        "EXCEPTION WHEN insufficient_privilege THEN",
        "    RAISE WARNING {hint};",
        "END $$;",
    ]
    return sql.SQL("\n".join(lines) + "\n").format(**values).as_string()
