-- Adversarial convergence suite schema (tests/adversarial/workload.py drives it). Idempotent.
-- parent: every common column type plus four big columns stored out of line (STORAGE EXTERNAL,
-- filled with >8 kB of poorly compressible data), so updates of the small columns arrive with
-- Debezium's unchanged-TOAST placeholder for them (REPLICA IDENTITY DEFAULT).
CREATE SCHEMA IF NOT EXISTS adv;

CREATE TABLE IF NOT EXISTS adv.parent (
    id         bigint PRIMARY KEY,
    c_int2     smallint,
    c_int4     integer,
    c_int8     bigint,
    c_num      numeric(14, 4),
    c_numv     numeric,
    c_float8   double precision,
    c_bool     boolean,
    c_text     text,
    c_varchar  varchar(64),
    c_uuid     uuid,
    c_jsonb    jsonb,
    c_bytea    bytea,
    c_date     date,
    c_ts       timestamp,
    c_tstz     timestamptz,
    c_interval interval,
    c_tags     text[],
    c_ints     integer[],
    big_text   text,
    big_bytes  bytea,
    big_json   jsonb,
    big_ints   integer[]
);
ALTER TABLE adv.parent ALTER COLUMN big_text SET STORAGE EXTERNAL;
ALTER TABLE adv.parent ALTER COLUMN big_bytes SET STORAGE EXTERNAL;
ALTER TABLE adv.parent ALTER COLUMN big_json SET STORAGE EXTERNAL;
ALTER TABLE adv.parent ALTER COLUMN big_ints SET STORAGE EXTERNAL;

-- child: a composite (text, int) key whose text part may hold '|' and '\'; cascades from parent
-- (deletes, and primary-key moves of the parent).
CREATE TABLE IF NOT EXISTS adv.child (
    k          text NOT NULL,
    n          integer NOT NULL,
    parent_id  bigint NOT NULL REFERENCES adv.parent (id) ON DELETE CASCADE ON UPDATE CASCADE,
    qty        integer NOT NULL,
    note       text,
    PRIMARY KEY (k, n)
);

-- deferred: a DEFERRABLE INITIALLY DEFERRED primary key. Postgres never uses a deferrable index
-- as the replica identity, so with REPLICA IDENTITY DEFAULT the table would have none and every
-- UPDATE/DELETE would fail once it is in a publication ("does not have a replica identity"):
-- FULL is required (Debezium still keys records by the primary key).
CREATE TABLE IF NOT EXISTS adv.deferred (
    id    integer NOT NULL,
    val   text NOT NULL,
    CONSTRAINT deferred_pkey PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED
);
ALTER TABLE adv.deferred REPLICA IDENTITY FULL;

-- arrays: one nullable array column per element type Debezium carries (interval[], money[] and
-- xml[] it leaves out of its records: docs/known-limits.md), each over 3 kB of poorly
-- compressible elements, more than the 2 kB TOAST target on its own, and STORAGE EXTERNAL: every
-- one is stored out of line (the row holds ~50 kB), so an update of `n` or `note` sends each as
-- Debezium's unchanged-TOAST placeholder, in the form it has for that type (or null). The two
-- spare columns are what the drop/rename scenario changes; the workload fills columns by type,
-- read from the catalog, so it keeps writing after it. citext[] is added by
-- workload.create_schema when the extension is available.
CREATE TABLE IF NOT EXISTS adv.arrays (
    id          bigint PRIMARY KEY,
    n           integer NOT NULL,
    note        text,
    a_float8    float8[],
    a_real      real[],
    a_int2      int2[],
    a_int4      int4[],
    a_int8      int8[],
    a_numeric   numeric[],
    a_bool      bool[],
    a_date      date[],
    a_tstz      timestamptz[],
    a_uuid      uuid[],
    a_text      text[],
    a_varchar   varchar[],
    a_char      char(8)[],
    a_jsonb     jsonb[],
    spare_drop  int8[],
    spare_name  text[]
);
DO $$
DECLARE column_name text;
BEGIN
    FOR column_name IN
        SELECT attname FROM pg_attribute
        WHERE attrelid = 'adv.arrays'::regclass AND attnum > 0 AND NOT attisdropped
          AND atttypid IN (SELECT oid FROM pg_type WHERE typcategory = 'A')
    LOOP
        EXECUTE format('ALTER TABLE adv.arrays ALTER COLUMN %I SET STORAGE EXTERNAL', column_name);
    END LOOP;
END $$;

-- truncated: rows TRUNCATEd while the workload writes (no foreign key points here), and written
-- again after; every sink must drop the rows older than the truncate and keep the later ones.
CREATE TABLE IF NOT EXISTS adv.truncated (
    id     integer PRIMARY KEY,
    val    text NOT NULL,
    round  integer NOT NULL DEFAULT 0
);

-- tag, child_tag: the third level of the suite's document index (mapping.yaml `documents`:
-- parent -> children -> tags, a many-to-many through child_tag). Only the documents hold them
-- (no flat route). child_tag's composite foreign key follows child key moves (ON UPDATE
-- CASCADE) and both deletes cascade, so one statement changes rows of three document tables.
CREATE TABLE IF NOT EXISTS adv.tag (
    id     integer PRIMARY KEY,
    label  text NOT NULL
);

CREATE TABLE IF NOT EXISTS adv.child_tag (
    k       text NOT NULL,
    n       integer NOT NULL,
    tag_id  integer NOT NULL REFERENCES adv.tag (id) ON DELETE CASCADE,
    PRIMARY KEY (k, n, tag_id),
    FOREIGN KEY (k, n) REFERENCES adv.child (k, n) ON DELETE CASCADE ON UPDATE CASCADE
);

-- probe: one row, never written by the workload, that the freshness probe (probe.py) updates
-- twice a second while the search server is frozen: the cache and the warehouse must show each
-- update within seconds while search is behind (invariant 8: no sink waits for another).
CREATE TABLE IF NOT EXISTS adv.probe (
    id  integer PRIMARY KEY,
    n   bigint NOT NULL
);
INSERT INTO adv.probe (id, n) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;

-- Debezium's signal table (incremental snapshots: the documented cache repair).
CREATE TABLE IF NOT EXISTS adv.cdc_sync_signal (
    id    varchar(64) PRIMARY KEY,
    type  varchar(32) NOT NULL,
    data  varchar(2048)
);

-- Written by the connector's `heartbeat.action.query` every `heartbeat.interval.ms`: its captured
-- changes carry WAL positions, so the sync job's read-your-writes watermarks advance while the
-- other tables are idle (mapping `source.heartbeat_table`; never written to the sinks).
CREATE TABLE IF NOT EXISTS adv.cdc_sync_heartbeat (
    connector  text PRIMARY KEY,
    beat_at    timestamptz NOT NULL
);
