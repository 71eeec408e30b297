"""Tip watches: with fan-out, a read's subscription goes on after its range and tells the driver
each new record Kinesis pushes to it, so the driver learns a shard's tip without ``GetRecords``
(whose 5 calls/s per shard every polling application of the stream shares).

Why the read's own subscription, kept open in the worker: Kinesis allows one subscription per
consumer and shard, refuses a new one within 5 s of the last, and lets a later one take the
current one over. The driver plans a shard's next range 5 s after the read subscribed
(``Planner._held``), so the next read takes the watch over exactly when it could subscribe
anyway: a watch never costs a ``SubscribeToShard`` call nor delays a read, and it never
subscribes itself (so it can never take anything over).

What a watch costs: records that arrive between two ranges are received twice, by the watch
and by the next range (EFO data retrieval is billed per GB; ``efoTipWatch=false`` goes back to
the driver's ``GetRecords`` probes), and a thread and a connection per watched shard in the worker
(at most ``MAX_WATCHES`` per process; the shards past it are probed).

A watch ends when its subscription does (taken over by the next read, Kinesis' 5-minute end, an
error, the shard's end), when a read of the same shard starts in this process, or when the
driver does not take its report (the query stopped): it then says so in a last report, so the
driver probes the shard again at once. A report names only records Kinesis sent, so a lost,
late or wrong one costs a probe or a batch's freshness, never a record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kinesis_source.executor.cursor import data_bytes
from kinesis_source.executor.report import Delivery, send_reports
from kinesis_source.positions import ShardId
from kinesis_source.tip_reports import (
    WATCH_ENDED,
    WATCH_FLUSH_S,
    WATCH_HEARTBEAT_S,
    WATCH_LIVE,
    WATCH_SILENT_S,
    ReportAddress,
    TipReport,
)

log = logging.getLogger(__name__)

MAX_WATCHES = 256  # per worker process: each holds a thread and a connection (aws/clients.py's pool)


@dataclass(eq=False)
class _Watch:
    """One shard's watch: what it saw since its last report."""

    consumer_arn: str
    shard: ShardId
    address: ReportAddress
    subscribed_at: float | None
    seq: str  # the newest record the subscription sent
    close: Callable[[], None]
    behind_ms: int = 0
    bytes: int = 0  # data bytes received since the last report
    fresh: bool = False  # a record since the last report
    event_at: float = 0.0  # monotonic: the last event (a read's subscription just had some)
    reported_at: float = 0.0  # monotonic
    ended: bool = False
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> tuple[str, str]:
        return self.consumer_arn, self.shard.shard

    def report(self) -> TipReport:
        """The report of what the watch saw since the last (resets the counts)."""
        tip = TipReport(self.shard, self.seq, self.behind_ms, read_bytes=self.bytes, extra_bytes=self.bytes,
                        subscribed_at=self.subscribed_at, watch=WATCH_ENDED if self.ended else WATCH_LIVE)
        self.bytes, self.fresh = 0, False
        return tip


_watches: dict[tuple[str, str], _Watch] = {}
_lock = threading.Lock()
_flusher: threading.Thread | None = None


def start_watch(
    consumer_arn: str,
    shard: ShardId,
    address: ReportAddress,
    seq: str,
    behind_ms: int,
    subscribed_at: float | None,
    events: Iterator[dict],
    close: Callable[[], None],
) -> bool:
    """Follow ``events`` (a subscription of ``shard`` whose last record sent was ``seq``, in an
    event ``behind_ms`` behind the shard's newest) on a thread of its own, reporting to
    ``address``; False when this process watches ``MAX_WATCHES`` shards already (the caller
    then closes the subscription)."""
    global _flusher
    now = time.monotonic()
    watch = _Watch(consumer_arn, shard, address, subscribed_at, seq, close, behind_ms, event_at=now, reported_at=now)
    with _lock:
        if len(_watches) >= MAX_WATCHES:
            return False
        old = _watches.pop(watch.key, None)
        _watches[watch.key] = watch
        if _flusher is None or not _flusher.is_alive():
            _flusher = threading.Thread(target=_flush_forever, name="kinesis-ddb-tip-watches", daemon=True)
            _flusher.start()
    if old is not None:
        _end(old)
    threading.Thread(target=_follow, args=(watch, events), name=f"kinesis-ddb-watch-{shard}", daemon=True).start()
    return True


def stop_watch(consumer_arn: str, shard_id: str) -> None:
    """End this process's watch of the shard (a read of it is about to subscribe)."""
    with _lock:
        watch = _watches.get((consumer_arn, shard_id))
    if watch is not None:
        _end(watch)


def watching(consumer_arn: str, shard_id: str) -> bool:
    """True while this process watches the shard through the consumer."""
    with _lock:
        watch = _watches.get((consumer_arn, shard_id))
        return watch is not None and not watch.ended


def watched() -> list[ShardId]:
    """The shards this process watches (for tests and logs)."""
    with _lock:
        return [w.shard for w in _watches.values() if not w.ended]


def _end(watch: _Watch) -> None:
    """Stop following and drop the connection (the thread then finishes)."""
    watch.stop.set()
    try:
        watch.close()
    except Exception:  # noqa: BLE001 - a connection being dropped anyway
        log.debug("closing the watch of %s failed", watch.shard, exc_info=True)


def _follow(watch: _Watch, events: Iterator[dict]) -> None:
    """Note each event's newest record until the subscription ends (any error ends it: the
    driver then probes, as it would without a watch)."""
    try:
        for message in events:
            if watch.stop.is_set():
                break
            event = message.get("SubscribeToShardEvent")
            if event is None:
                continue
            records = event.get("Records") or []
            with _lock:
                watch.event_at = time.monotonic()
                watch.behind_ms = int(event.get("MillisBehindLatest") or 0)
                if records:
                    watch.seq = records[-1]["SequenceNumber"]
                    watch.bytes += data_bytes(records)
                    watch.fresh = True
            # The shard's end: the driver's probe finds it, once.
            if event.get("ChildShards") or event.get("ContinuationSequenceNumber") is None:
                break
    except Exception as exc:  # noqa: BLE001 - taken over, dropped, timed out: the watch is over
        log.debug("the tip watch of %s ended: %s", watch.shard, exc)
    finally:
        with _lock:
            watch.ended = True
        _end(watch)


def _flush_forever() -> None:
    while True:
        time.sleep(WATCH_FLUSH_S)
        try:
            flush()
        except Exception:  # noqa: BLE001 - a report is an optimisation; the flusher must live on
            log.warning("sending tip watch reports failed", exc_info=True)


def flush(now: float | None = None) -> None:
    """Send what the watches saw: new records, a heartbeat every ``WATCH_HEARTBEAT_S`` of a
    watch whose last event is more recent than ``WATCH_SILENT_S`` (a silent subscription does
    not keep the driver's probes away), a watch's end; one message per driver. A driver that
    refuses the message (stopped, unreachable) ends its watches; one that answers late does not."""
    now = time.monotonic() if now is None else now
    out: dict[ReportAddress, list[tuple[_Watch, TipReport]]] = {}
    with _lock:
        for key, watch in list(_watches.items()):
            beat = now - watch.reported_at >= WATCH_HEARTBEAT_S and now - watch.event_at < WATCH_SILENT_S
            if watch.fresh or beat or watch.ended:
                watch.reported_at = now
                out.setdefault(watch.address, []).append((watch, watch.report()))
            if watch.ended:
                del _watches[key]
    for address, sent in out.items():
        # A late answer is a busy driver: the watches go on (a lost report costs a probe).
        if send_reports(address, [tip for _, tip in sent]) is Delivery.REFUSED:
            for watch, _ in sent:
                _end(watch)
