"""Sinks: search (Elasticsearch/OpenSearch), cache (Redis), warehouse (Delta Lake).

Every sink package has the same files: `actions.py` (pure `to_actions(route, changes)`),
`client.py` (`write_batch(actions) -> WriteResult`), `target.py` (`ensure_target`: create or
evolve the index / table), `readback.py` (what the target holds: used by verify, the mapping
check and the tests), and `__init__.py` exposing the `Sink`.
"""
