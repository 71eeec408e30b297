"""A stream that reshards by itself: splits and merges from a thread, for the chaos suite and
the soak."""

from __future__ import annotations

import threading

from tests.support.waiting import wait_for


class Resharder:
    """Splits and merges a stream's open shards, from a thread every ``interval`` seconds
    (seeded) and on demand, keeping between ``min_open`` and ``max_open`` shards open."""

    def __init__(self, kinesis, stream: str, rng, interval=(6.0, 12.0), min_open: int = 2, max_open: int = 4):
        self._kinesis, self._stream, self._rng = kinesis, stream, rng
        self._interval, self._min, self._max = interval, min_open, max_open
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.done: list[tuple[str, tuple[str, ...]]] = []
        self.error: BaseException | None = None

    def shards(self) -> list[dict]:
        """Every shard of the stream, closed ones included (all ``ListShards`` pages)."""
        out, token = [], None
        while True:
            page = (self._kinesis.list_shards(NextToken=token) if token
                    else self._kinesis.list_shards(StreamName=self._stream))
            out += page["Shards"]
            token = page.get("NextToken")
            if not token:
                return out

    def open_shards(self) -> list[dict]:
        """Open shards in hash-key order."""
        return sorted((s for s in self.shards() if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
                      key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))

    def split(self, shard: dict) -> None:
        """Split ``shard`` (a ``ListShards`` entry) at the middle of its hash range; the caller
        holds the lock or the thread is held (:meth:`hold`)."""
        lo, hi = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
        self._kinesis.split_shard(StreamName=self._stream, ShardToSplit=shard["ShardId"],
                                  NewStartingHashKey=str((lo + hi) // 2))
        self._settle(("split", (shard["ShardId"],)))

    def hold(self) -> None:
        """No reshard from the thread until :meth:`release` (one under way completes first)."""
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def reshard_once(self, prefer: str | None = None) -> str:
        """One split or merge, within the open-shard bounds: ``prefer``'s kind where the bounds
        allow it, else a seeded choice. Returns the kind done."""
        with self._lock:
            shards = self.open_shards()
            merge = prefer == "merge" or (prefer is None and self._rng.random() < 0.5)
            if len(shards) >= self._max or (len(shards) > self._min and merge):
                i = self._rng.randrange(len(shards) - 1)
                a, b = shards[i], shards[i + 1]
                self._kinesis.merge_shards(StreamName=self._stream, ShardToMerge=a["ShardId"],
                                           AdjacentShardToMerge=b["ShardId"])
                self._settle(("merge", (a["ShardId"], b["ShardId"])))
                return "merge"
            self.split(self._rng.choice(shards))
            return "split"

    def _settle(self, what: tuple[str, tuple[str, ...]]) -> None:
        wait_for(
            lambda: self._kinesis.describe_stream_summary(StreamName=self._stream)[
                "StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE",
            timeout=60, what=f"{self._stream} ACTIVE after {what}",
        )
        self.done.append(what)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._rng.uniform(*self._interval)):
                self.reshard_once()
        except BaseException as exc:  # noqa: BLE001 - reported by __exit__
            self.error = exc

    def __enter__(self) -> Resharder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"resharding failed: {self.error!r}")
