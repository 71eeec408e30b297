"""The sink: ``df.write[Stream].format("kinesis-ddb")`` puts rows into a Kinesis stream.

What runs where: :mod:`~kinesis_source.sink.writer` is the Spark glue (the driver checks the
schema and the stream, executors write, the driver sums up each batch); the executors' work is
in :mod:`~kinesis_source.sink.putter` (requests, per-record retries, per-key order),
:mod:`~kinesis_source.sink.pacing` (the shards' write quotas),
:mod:`~kinesis_source.sink.rows` (columns in, records out) and
:mod:`~kinesis_source.sink.shards` (which shard a key goes to, KPL aggregation's grouping).
"""
