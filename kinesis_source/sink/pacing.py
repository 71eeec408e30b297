"""The shards' write quotas, as budgets the sink spends before it sends, not throttles it
learns after.

Kinesis takes 1 MiB/s and 1,000 records/s per shard, from every writer together, and refuses
the records past that (``ProvisionedThroughputExceededException`` inside a ``PutRecords``
answer). Each task keeps, per shard, two token buckets, one second deep (bytes, as Kinesis
counts them: data and partition key; and records), refilled at ``maxWriteRatePerShard`` and
``maxRecordsPerSecondPerShard`` (a record larger than its bucket goes when the bucket is full and
overdraws it, so a low rate cap still passes 1 MiB records, on average at the cap); a record
goes into a request only when both buckets hold it, and a task with nothing that fits waits
exactly until the first shard with records waiting has room.

Other writers of the shard (other tasks of the same write, other applications) spend the same
quota unseen. An answer that refuses records of a shard says they did: the shard's rate is cut to
70% (once per answer, however many records it refused) and its buckets emptied, and while
nothing is refused the rate grows back by 10% of the configured rate each second (additive
increase, multiplicative decrease, as TCP shares a link). Tasks that share shards thus settle
near their share instead of refusing each other over and over.

The model never holds more than Kinesis' bucket: the refill of a request spent from a full bucket
counts from its answer (:meth:`WriteBudget.answered`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

CUT = 0.7
MIN_SHARE = 0.05
RECOVERY_PER_S = 0.1


@dataclass
class _Bucket:
    rate: float
    depth: float
    level: float
    anchor: bool = False  # spent from full: its refill counts from that request's answer

    def refill(self, rate: float, elapsed: float) -> None:
        self.level = min(self.depth, self.level + rate * elapsed)


@dataclass
class _Shard:
    bytes_: _Bucket
    records: _Bucket
    share: float = 1.0
    at: float = 0.0


@dataclass
class WriteBudget:
    """Per shard, what this task may still write now (see the module's docstring)."""

    bytes_per_s: float
    records_per_s: float
    _shards: dict[str, _Shard] = field(default_factory=dict)

    def _shard(self, shard_id: str, now: float) -> _Shard:
        shard = self._shards.get(shard_id)
        if shard is None:
            shard = _Shard(
                _Bucket(self.bytes_per_s, self.bytes_per_s, self.bytes_per_s),
                _Bucket(self.records_per_s, max(1.0, self.records_per_s), max(1.0, self.records_per_s)),
                at=now,
            )
            self._shards[shard_id] = shard
        elapsed = max(0.0, now - shard.at)
        if elapsed:
            shard.bytes_.refill(self.bytes_per_s * shard.share, elapsed)
            shard.records.refill(self.records_per_s * shard.share, elapsed)
            shard.share = min(1.0, shard.share + RECOVERY_PER_S * elapsed)
            shard.at = now
        return shard

    def take(self, shard_id: str, nbytes: int, now: float) -> bool:
        """Spend one record of ``nbytes`` on ``shard_id`` if it fits now; False (nothing spent)
        if not."""
        shard = self._shard(shard_id, now)
        # A record larger than the bucket goes when the bucket is full, and overdraws it.
        if shard.bytes_.level < min(nbytes, shard.bytes_.depth) or shard.records.level < 1:
            return False
        for bucket in (shard.bytes_, shard.records):
            bucket.anchor |= bucket.level >= bucket.depth
        shard.bytes_.level -= nbytes
        shard.records.level -= 1
        return True

    def wait_s(self, shard_id: str, nbytes: int, now: float) -> float:
        """Seconds until a record of ``nbytes`` fits on ``shard_id``."""
        shard = self._shard(shard_id, now)
        short_bytes = max(0.0, min(nbytes, shard.bytes_.depth) - shard.bytes_.level) / (self.bytes_per_s * shard.share)
        short_records = max(0.0, 1 - shard.records.level) / (self.records_per_s * shard.share)
        return max(short_bytes, short_records)

    def answered(self, shard_id: str, now: float) -> None:
        """A request with records of ``shard_id`` was answered at ``now``.

        Kinesis' bucket, full like the model's, starts to refill when the request arrives,
        which is after the model sent it; if later requests travel faster than that one, the
        server holds less than the model for as long as the bucket drains (measured: the
        first request on a new connection took 4-65 ms against 2 ms for the next, and 1-16
        records were refused right after the first second's burst). So the refill of a
        request spent from a full bucket counts from its answer, which is never earlier than
        its arrival: the model then never holds more than the server.
        """
        shard = self._shards.get(shard_id)
        if shard is None or not (shard.bytes_.anchor or shard.records.anchor):
            return
        elapsed = max(0.0, now - shard.at)
        for bucket, rate in ((shard.bytes_, self.bytes_per_s), (shard.records, self.records_per_s)):
            if not bucket.anchor:
                bucket.refill(rate * shard.share, elapsed)
            bucket.anchor = False
        shard.at = max(shard.at, now)

    def refused(self, shard_id: str, now: float) -> None:
        """Kinesis refused records of ``shard_id`` for throughput in one answer: others are
        writing the shard (called once per answer, however many records it refused)."""
        shard = self._shard(shard_id, now)
        shard.share = max(MIN_SHARE, shard.share * CUT)
        shard.bytes_.level = 0.0
        shard.records.level = 0.0

    def share(self, shard_id: str) -> float:
        """The share of the configured rates ``shard_id`` is written at now (1.0 until a
        refusal)."""
        shard = self._shards.get(shard_id)
        return shard.share if shard else 1.0
