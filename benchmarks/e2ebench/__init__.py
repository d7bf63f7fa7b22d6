"""Pieces of the end-to-end benchmark (benchmarks/bench_e2e.py): load, raw sink rates, the
pipeline, the commit -> visible sampler, the job's stage breakdown, the report."""
