"""Benchmarks for kinesis-ddb: ratios measured in one run against baselines on the same machine."""
