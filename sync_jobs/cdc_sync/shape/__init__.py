"""What each sink holds of a routed row: filters, computed / masked / hashed / dropped fields,
soft deletes (mapping keys `filter`, `computed`, `mask`, `hash`, `drop`, `columns`,
`on_delete`). One home for the rule, used by the job's writes, verify and `mappings validate`.

`spec` holds the parsed settings, `engine` evaluates SQL expressions on Arrow batches
(DuckDB), `changes` turns a table's changes into each sink's changes, `rows` shapes Postgres
rows the same way for verify.
"""
