"""Where a query starts, in one place: the resume matrix (Spark's checkpoint, else the
positions committed in DynamoDB, else option 'initialPosition' resolved once and stored),
streams added to an application that already ran, and 'initialPosition' resolved per shard.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from kinesis_source.aws.kinesis import ShardInfo
from kinesis_source.driver.probe import ProbeResult, TailProber, settle_all
from kinesis_source.errors import OptionError
from kinesis_source.lineage import superseded
from kinesis_source.option_values import InitialPosition, parse_initial_position
from kinesis_source.positions import AFTER, AT, SHARD_END, Offset, Position, ShardId

if TYPE_CHECKING:
    from kinesis_source.driver.application import Application

log = logging.getLogger(__name__)


def latest_position(sid: ShardId, found: ProbeResult, now: datetime) -> Position:
    """``LATEST`` for one shard: after its newest record (TRIM_HORIZON when it has none). A
    shard whose probe only crossed empty pages until the deadline starts at the resolution
    time instead: the records that arrive after it, by the server's arrival timestamps."""
    if found.tip is not None:
        return Position.after(found.tip)
    if found.pending:
        log.warning(
            "Kinesis stream '%s' shard '%s' served only empty pages while LATEST was resolved; "
            "it starts at the records that arrived after %s",
            sid.stream, sid.shard, now.isoformat(),
        )
        return Position.at_timestamp(now)
    return Position.trim_horizon()


def initial_for(spec: InitialPosition, sid: ShardId) -> str:
    if spec.kind == "TRIM_HORIZON":
        return Position.trim_horizon().to_str()
    if spec.kind == "LATEST":
        return "LATEST"
    if spec.kind == "AT_TIMESTAMP":
        assert spec.timestamp is not None
        return Position.at_timestamp(spec.timestamp).to_str()
    named = dict(spec.shards)
    # the user names a shard as '<stream>/<shardId>' or by its id alone
    return named.get(str(sid), named.get(sid.shard, "TRIM_HORIZON"))


def at_progress(wanted: Mapping[ShardId, str]) -> set[ShardId]:
    """The shards whose wanted start is a point in their log (after or at a record, or
    SHARD_END), not a starting point such as TRIM_HORIZON."""
    return {
        sid
        for sid, text in wanted.items()
        if text != "LATEST" and Position.parse(text).kind in (AT, AFTER, SHARD_END)
    }


def check_named_shards(spec: InitialPosition, listing: dict[str, list[ShardInfo]]) -> None:
    known = {s.shard_id for shards in listing.values() for s in shards}
    known |= {str(ShardId(st, s.shard_id)) for st, shards in listing.items() for s in shards}
    for key, value in spec.shards:
        if key not in known and value != "SHARD_END":  # an expired, finished shard is fine
            streams = ", ".join(listing)
            raise OptionError(
                f"Option 'initialPosition' names shard '{key}', which stream(s) {streams} do "
                f"not have; known shards: {', '.join(sorted(s for s in known if '/' not in s))}"
            )
    if len(listing) > 1:
        bare = [key for key, _ in spec.shards if "/" not in key]
        if bare:
            raise OptionError(
                f"Option 'initialPosition' names shard '{bare[0]}' without its stream; with "
                "several streams write '<stream>/<shardId>'"
            )


async def resolve_positions(
    spec: InitialPosition,
    listing: Mapping[str, list[ShardInfo]],
    prober: TailProber,
    streams: Collection[str] | None = None,
) -> Offset:
    """``spec`` resolved per listed shard (of ``streams`` only, if given): LATEST after each
    tip (probes settle shards behind empty pages), a shard named by a descendant at a point
    in its log skipped as finished."""
    wanted: dict[ShardId, str] = {}
    for stream, shards in listing.items():
        if streams is not None and stream not in streams:
            continue
        for shard in shards:
            sid = ShardId(stream, shard.shard_id)
            wanted[sid] = initial_for(spec, sid)
    if spec.kind == "SHARDS":
        check_named_shards(spec, dict(listing))
        # A shard whose descendant is named at a point in its log (as `checkpoints export`
        # writes, which leaves out finished parents) was read to its end: not again.
        named = dict(spec.shards)
        for sid in superseded(listing, at_progress(wanted)):
            if str(sid) not in named and sid.shard not in named:  # named: as the user says
                del wanted[sid]
    latest = {key: Position.trim_horizon() for key, v in wanted.items() if v == "LATEST"}
    now = datetime.now(timezone.utc)
    probed = await settle_all(prober, latest) if latest else {}
    positions = {}
    for sid, text in wanted.items():
        if text == "LATEST":
            found = probed[sid]
            if found.gone:
                continue  # expired since it was listed: nothing of it is left to read
            pos = latest_position(sid, found, now)
        else:
            pos = Position.parse(text)
        positions[sid] = pos
    log.info("initial positions resolved for %d shards (%s)", len(positions), spec)
    return Offset(positions)


class StartResolver:
    """Where this run starts (``initialOffset``) and where streams added since Spark's
    checkpoint enter it."""

    def __init__(self, app: Application) -> None:
        self._app = app
        self._initial: Offset | None = None

    def initial_offset(self) -> Offset:
        """Where a query without a Spark checkpoint starts (the resume matrix); the same
        answer every time it is asked in a run."""
        if self._initial is None:
            self._initial = self._resolve_start()
        return self._initial

    def _resolve_start(self) -> Offset:
        app = self._app
        epoch = app.claim()
        snapshot = app.claimed
        assert snapshot is not None
        meta = snapshot.meta
        name, table = app.opts.application_name, app.opts.checkpoint_table
        if meta is not None and meta.resolved is not None:
            base = dict(meta.resolved.shards)
            if snapshot.shards:
                log.info(
                    "application %s resumes from %d committed positions in table %s",
                    name, len(snapshot.shards), table,
                )
            else:
                log.info("application %s restarts at its stored initial positions", name)
            base.update(snapshot.positions())
            added = app.catalogue.streams_entering(Offset(base))
            if added:
                base.update(self._add_streams(added))
            return Offset(base)
        if meta is not None and meta.initial_spec is not None:
            spec_text = meta.initial_spec  # set by `checkpoints reset`
            spec = parse_initial_position(spec_text)
        else:
            spec = app.opts.initial_position
            spec_text = str(spec)
        resolved = app.catalogue.resolve_initial(spec)
        if snapshot.shards:  # committed rows but no stored initial (e.g. imported): rows win
            resolved = Offset({**resolved.shards, **snapshot.positions()})
        app.store.save_initial(epoch, spec_text, resolved, app.catalogue.stream_identities())
        app.resolved = resolved
        shown = spec_text if len(spec_text) <= 200 else f"{len(resolved.shards)} named shard(s)"
        log.info("application %s starts at %s (stored in table %s)", name, shown, table)
        return resolved

    def _add_streams(self, streams: list[str]) -> dict[ShardId, Position]:
        """Start positions for streams added to an application that already has stored
        initial positions: option 'initialPosition' resolved for them alone, stored with the
        others (and the streams' identities), so every later start finds them."""
        app = self._app
        assert app.epoch is not None and app.resolved is not None
        spec = app.opts.initial_position
        added = app.catalogue.resolve_initial(spec, streams)
        merged = Offset({**app.resolved.shards, **added.shards})
        meta = app.meta
        spec_text = meta.initial_spec if meta and meta.initial_spec else str(spec)
        identities = {**(meta.streams if meta else {}), **app.catalogue.stream_identities()}
        app.store.save_initial(app.epoch, spec_text, merged, identities)
        app.resolved = merged
        app.remember_streams(identities)
        log.info(
            "application %s: stream(s) %s added; they start at %s (stored in table %s)",
            app.opts.application_name, ", ".join(streams), spec, app.opts.checkpoint_table,
        )
        return dict(added.shards)

    def entering(self, start: Offset) -> dict[ShardId, Position] | None:
        """Start positions of streams that have shards but none in ``start`` (Spark's
        checkpoint predates them), or None: they enter the offset in a batch of their own
        (``plan_ranges`` reads nothing of them there). A stream new to the application starts
        at option 'initialPosition' (resolved once and stored); one it knew (re-created while a
        query ran), or any stream of an application without stored initial positions (rows
        imported from KCL), starts at TRIM_HORIZON, as a new shard does."""
        app = self._app
        streams = app.catalogue.streams_entering(start)
        if not streams:
            return None
        app.claim()
        known = app.streams_known()
        new = [s for s in streams if s not in known]
        positions = self._add_streams(new) if new and app.resolved is not None else {}
        listing = app.catalogue.listed()
        for stream in streams:
            if stream not in new or app.resolved is None:
                for shard in listing.get(stream, []):
                    positions.setdefault(ShardId(stream, shard.shard_id), Position.trim_horizon())
        return positions
