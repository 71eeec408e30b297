"""Per-shard lag for the user's process, from Spark's progress events.

The source's ``reportLatestOffset()`` puts, per shard, the tip found by the last probe and
``millisBehindLatest`` (how far the batch's start was behind that tip) into
``StreamingQueryProgress.sources[].latestOffset``. :class:`KinesisLagListener` is a
``StreamingQueryListener`` that turns those into a :class:`LagReport` per progress event, passes
it to a callback and, when ``prometheus-client`` is installed, sets gauges.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LagReport:
    """Lag of one query at one progress event."""

    query_id: str
    query_name: str | None
    batch_id: int
    millis_behind: Mapping[str, int]  # "<stream>/<shardId>" -> ms behind the tip
    tips: Mapping[str, str | None]

    @property
    def max_millis_behind(self) -> int:
        """The largest lag over all shards (0 when none reported)."""
        return max(self.millis_behind.values(), default=0)


def lag_report(progress: Any) -> LagReport | None:
    """The lag figures of a progress event, or None if no kinesis-ddb source reported any."""
    behind: dict[str, int] = {}
    tips: dict[str, str | None] = {}
    found = False
    for source in progress.sources:
        raw = source.latestOffset
        try:
            report = json.loads(raw) if isinstance(raw, str) else raw
        except (TypeError, ValueError):
            continue
        if not isinstance(report, dict) or "shards" not in report:
            continue
        found = True
        for key, shard in report["shards"].items():
            behind[key] = int(shard.get("millisBehindLatest") or 0)
            tips[key] = shard.get("tip")
    if not found:
        return None
    return LagReport(str(progress.id), progress.name, progress.batchId, behind, tips)


class _Gauges:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Gauge

        kwargs = {"registry": registry} if registry is not None else {}
        self.shard = Gauge(
            "kinesis_ddb_millis_behind_latest",
            "How far behind the shard's tip the last planned batch started, in ms",
            ["query", "shard"],
            **kwargs,
        )
        self.max = Gauge(
            "kinesis_ddb_max_millis_behind_latest",
            "The largest per-shard lag of the query, in ms",
            ["query"],
            **kwargs,
        )

    def update(self, report: LagReport) -> None:
        name = report.query_name or report.query_id
        for shard, ms in report.millis_behind.items():
            self.shard.labels(query=name, shard=shard).set(ms)
        self.max.labels(query=name).set(report.max_millis_behind)


class KinesisLagListener(StreamingQueryListener):
    """``spark.streams.addListener(KinesisLagListener(callback))``.

    ``callback(report)`` runs in this process for every progress event of a query with a
    kinesis-ddb source. Gauges ``kinesis_ddb_millis_behind_latest{query,shard}`` and
    ``kinesis_ddb_max_millis_behind_latest{query}`` are set when ``prometheus-client`` is
    installed (pass ``registry`` to use another than the default one, ``prometheus=False`` to
    skip them).
    """

    def __init__(
        self,
        callback: Callable[[LagReport], Any] | None = None,
        prometheus: bool = True,
        registry: Any = None,
    ) -> None:
        self._callback = callback
        self._gauges = None
        if prometheus:
            try:
                self._gauges = _Gauges(registry)
            except ImportError:
                log.debug("prometheus-client is not installed: no lag gauges")

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
        """Nothing to report yet."""

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        """Report the lag of this progress event."""
        report = lag_report(event.progress)
        if report is None:
            return
        if self._gauges is not None:
            self._gauges.update(report)
        if self._callback is not None:
            self._callback(report)

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        """Idle events carry no progress."""

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        """Nothing to clean up."""
