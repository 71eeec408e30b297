"""Everything the driver knows about each shard, in one record per shard.

The driver's parts (the tip table and its probe schedule, the call and byte budgets, the tail
probe's iterators, the hand-out of ranges) each keep their own rules, but none keeps a map of
shards: what they know of a shard lives in its :class:`ShardState`, found in the one
:class:`ShardStates` of the query run. So a shard that leaves the query is forgotten in one
place, and a reader of the code finds a shard's whole state in one class.

Who changes it: the planner's event loop (probes, executors' reports, hand-outs), under
:attr:`ShardStates.lock`; Spark's thread only reads it, under the same lock, when it patches
``latestOffset``'s last answer (``driver/answers.py``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kinesis_source.positions import ShardId

if TYPE_CHECKING:  # (the parts import this module; it needs their types only for annotations)
    from kinesis_source.driver.budget import _Window
    from kinesis_source.driver.feeds import Feed
    from kinesis_source.driver.probe import ProbeResult
    from kinesis_source.driver.tip_view import ShardTip
    from kinesis_source.read_rate import ShardBytes


@dataclass(eq=False)
class ShardState:
    """One shard, as the driver knows it. Each field names the part whose rules change it."""

    key: ShardId
    # The tip table's knowledge since the position it was seeded with (``driver/tip_view.py``):
    # tip, probe schedule, holds, watch lease, counts, carried run. Replaced when the shard is
    # seeded again; None while the table does not track the shard.
    view: ShardTip | None = None
    # A probe's answer from TRIM_HORIZON made before the table tracked the shard (an
    # AvailableNow target's), to seed its first view from (``driver/tips.py``).
    found: ProbeResult | None = None
    # -- calls (``driver/budget.py``) --
    windows: dict[str, _Window] = field(default_factory=dict)  # by operation
    carried_whole: bool = False  # its last range went to the executor whole: no executor call
    read_booked: bool = False  # an executor read was booked in its windows (none waits before)
    spent_ahead: dict[str, float] = field(default_factory=dict)  # calls a probe spent before making them
    # The executor read handed out and not yet reported: its range's end and its booked calls.
    booking: tuple[str, dict[str, list[float]]] | None = None
    subscribed_at: float = 0.0  # fan-out: the last subscription (wall clock)
    # -- the driver's fan-out subscription of the shard (``driver/feeds.py``) --
    feed: Feed | None = None
    # its last SubscribeToShard (monotonic; 0: none): a feed that replaces another keeps the
    # 1 s gap from a call the one it replaced may have sent
    called_at: float = 0.0
    # -- bytes (``driver/budget.py``) --
    bytes: ShardBytes | None = None
    # -- iterators (``driver/probe.py``) --
    continuation: tuple[str, str, float] | None = None  # (position, iterator there, made)
    # a few starts' iterators for executors: position -> (iterator, first record, made)
    openers: OrderedDict[str, tuple[str, str | None, float]] = field(default_factory=OrderedDict)
    record_bytes: float | None = None  # its records' size, as last read


class ShardStates:
    """The query run's :class:`ShardState` records and the lock they are changed under; also
    the two indexes over them that keep the driver's work proportional to what changed."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._states: dict[ShardId, ShardState] = {}
        # shards whose answer may differ from the one last handed out (``TipTable.take_changed``)
        self.changed: set[ShardId] = set()
        # shards handed to executors whose report has not come (``TipTable.batch_over``)
        self.unreported: set[ShardId] = set()

    def get(self, key: Hashable) -> ShardState | None:
        """``key``'s record, if the driver knows the shard."""
        return self._states.get(key)  # type: ignore[call-overload]

    def state(self, key: Hashable) -> ShardState:
        """``key``'s record, made now if the shard is new (``key``: a ``ShardId`` or a
        ``(stream, shard)`` pair, which compares equal)."""
        found = self._states.get(key)  # type: ignore[call-overload]
        if found is None:
            with self.lock:
                found = self._states.get(key)  # type: ignore[call-overload]
                if found is None:
                    # (a bare key stays as it is: unit tests of one part name shards so)
                    sid = ShardId(*key) if isinstance(key, tuple) and len(key) == 2 else key
                    found = self._states[sid] = ShardState(sid)  # type: ignore[arg-type,index]
        return found

    def forget(self, key: Hashable) -> ShardState | None:
        """Drop everything known of a shard that left the query; its record, if there was one."""
        with self.lock:
            self.changed.discard(key)
            self.unreported.discard(key)
            return self._states.pop(key, None)  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[ShardState]:
        return iter(list(self._states.values()))

    def viewed(self) -> Iterator[tuple[ShardId, ShardTip]]:
        """The shards the tip table tracks, with their views."""
        return ((s.key, s.view) for s in list(self._states.values()) if s.view is not None)

    def view(self, key: Hashable) -> ShardTip | None:
        """``key``'s view, if the tip table tracks it."""
        found = self._states.get(key)  # type: ignore[call-overload]
        return None if found is None else found.view
