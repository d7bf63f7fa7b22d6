-- One table holding every Postgres type the Debezium connector converts (issue: type fidelity).
CREATE SCHEMA IF NOT EXISTS types;
CREATE TYPE types.mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE types.all_types (
    id              integer PRIMARY KEY,
    c_int2          smallint,
    c_int4          integer,
    c_int8          bigint,
    c_numeric       numeric(12, 3),
    c_numeric_free  numeric,
    c_real          real,
    c_double        double precision,
    c_bool          boolean,
    c_text          text,
    c_varchar       varchar(20),
    c_char          char(5),
    c_uuid          uuid,
    c_json          json,
    c_jsonb         jsonb,
    c_bytea         bytea,
    c_date          date,
    c_time          time,
    c_timetz        timetz,
    c_timestamp     timestamp,
    c_timestamptz   timestamptz,
    c_interval      interval,
    c_enum          types.mood,
    c_int_array     integer[],
    c_text_array    text[],
    c_money         money,
    c_inet          inet,
    c_cidr          cidr,
    c_macaddr       macaddr,
    c_xml           xml
);
INSERT INTO types.all_types VALUES
    (1, 12, 123456, 9223372036854775807, 1234.567, 0.5, 1.25, 3.14159265358979,
     true, 'héllo wörld', 'varchar', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
     '{"b": 1,  "a": [true, null]}', '{"nested": {"k": "v"}, "n": 1.5}', '\x00ff10'::bytea,
     '2024-02-29', '23:59:59.999999', '12:34:56+02', '2024-02-29 12:34:56.123456',
     '2024-02-29 12:34:56.123456+02', '1 year 2 mons 3 days 04:05:06.789012', 'happy', '{1,2,3}',
     '{"a","b c"}', 1234.56, '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03', '<a>1</a>'),
    (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (3, -32768, -2147483648, -9223372036854775808, -999999999.999, -0.001, -0.5, -1e-300,
     false, '', '', '', '00000000-0000-0000-0000-000000000000', '{}', '[]', ''::bytea,
     '0001-01-01', '00:00:00', '00:00:00-05:30', '1970-01-01 00:00:00',
     '1970-01-01 00:00:00+00', '-1 mons -2 days 03:00:00.000001', 'sad', '{}', '{}', -0.01,
     '::1', '2001:db8::/32', 'ff:ff:ff:ff:ff:ff', '<x/>');

-- Written by the connector's `heartbeat.action.query` every `heartbeat.interval.ms`: its captured
-- changes carry WAL positions, so the sync job's read-your-writes watermarks advance while the
-- other tables are idle (mapping `source.heartbeat_table`; never written to the sinks).
CREATE TABLE IF NOT EXISTS types.cdc_sync_heartbeat (
    connector  text PRIMARY KEY,
    beat_at    timestamptz NOT NULL
);
