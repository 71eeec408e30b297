"""Planted defects: does a test suite still catch what it must? (issue 47: no guard lost)

Each defect is a small edit of the source that breaks one promise. For each, a copy of a
checkout gets the edit and its suite runs: the unit tests first, then the tests named for the
defect (the suite fails if any of them fails). A defect the suite does not catch is a guard lost.

    python -m tests.support.planted [--repo PATH] [--only NAME ...] [--report FILE] [--skip-unit]

``--repo``: the checkout whose suite is tried (default: this one); its ``tests`` run against
its own ``kinesis_source`` with the edit. The virtualenvs and kinesis-local come from this
checkout (``./dev setup``). Defects whose text a checkout lacks are reported as not applicable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Defect:
    """``edits``: (path, text, replacement), each text found exactly once; ``tests``: the
    suite's tests that should catch it beyond the unit tests (pytest node ids or paths)."""

    name: str
    what: str
    edits: tuple[tuple[str, str, str], ...]
    tests: tuple[str, ...] = ()


DEFECTS = (
    Defect(
        "string-seq-compare", "sequence numbers compared as strings, not integers",
        (("kinesis_source/positions.py", "    return int(check_seq(seq))",
          "    return check_seq(seq)  # type: ignore[return-value]"),),
    ),
    Defect(
        "no-epoch-check", "a commit's fencing condition passes for an older epoch",
        (("kinesis_source/checkpoints/writes.py",
          '''                "ConditionExpression": "epoch = :e",
                "ExpressionAttributeValues": {":e": {"N": str(epoch)}},''',
          '''                "ConditionExpression": "epoch >= :e",
                "ExpressionAttributeValues": {":e": {"N": str(epoch)}},'''),),
        ("tests/integration/test_checkpoint_store.py", "tests/chaos/test_fencing.py"),
    ),
    Defect(
        "checkpoint-format", "a stored position's field renamed without a new format version",
        (("kinesis_source/checkpoints/format.py", '        "position": shard.position.to_str(),',
          '        "pos": shard.position.to_str(),'),
         ("kinesis_source/checkpoints/format.py", '        position=Position.parse(entry["position"]),',
          '        position=Position.parse(entry["pos"]),')),
        ("tests/integration/test_checkpoint_formats.py",),
    ),
    Defect(
        "page-boundary-drop", "the first record of every page after the first is dropped",
        (("kinesis_source/executor/cursor.py",
          "            out = records  # (a page's records are in order: the whole page is in the range)",
          "            out = records[1:] if self.read else records"),),
        ("tests/integration/test_stream_read.py",),
    ),
    Defect(
        "parent-after-child", "a child shard is read before its parents are finished",
        (("kinesis_source/lineage.py",
          "            if all(_finished(p, by_id, children, stream, start) for p in _parents(shard)):",
          "            if True:"),),
        ("tests/integration/test_resharding.py",),
    ),
    Defect(
        "budget-window-off-by-one", "the call budget's window holds one call more than the rate",
        (("kinesis_source/driver/budget.py", "        self.n = max(1, math.ceil(rate))",
          "        self.n = max(1, math.ceil(rate)) + 1"),),
        ("tests/integration/test_quota_budget.py",
         "tests/integration/test_sparse_shards.py::"
         "test_a_sparse_shard_is_read_within_the_call_budget_every_call_naming_its_shard_and_stream"),
    ),
    Defect(
        "carried-past-end", "a carried run hands its batch one record past the range's end",
        (("kinesis_source/driver/carried.py", "            return taken, True, None, left",
          "            return tuple(self.records[: cut + 1]), True, None, left"),),
        ("tests/integration/test_stream_read.py",),
    ),
    Defect(
        "sink-row-not-retried", "a row Kinesis refused in a PutRecords answer is not sent again",
        (("kinesis_source/sink/putter.py",
          "            heapq.heappush(self._ready, entry)  # with preserveKeyOrder, still its unit's oldest",
          "            self._done(entry)"),),
        ("tests/integration/test_sink.py",),
    ),
    Defect(
        "resume-at-not-after", "a resume re-reads the last committed record (AT, not AFTER)",
        (("kinesis_source/executor/cursor.py",
          "    if start.kind == AFTER and start.sub_seq is None:\n        return records[1:], None",
          "    if False:\n        return records[1:], None"),),
        ("tests/integration/test_checkpoints_spark.py",),
    ),
    Defect(
        "kpl-last-subrecord", "de-aggregation drops the last user record of an aggregate",
        (("kinesis_source/kpl.py",
          "    return keys, hash_keys, [_user_record(rec, len(keys), len(hash_keys)) for rec in raw]",
          "    return keys, hash_keys, [_user_record(rec, len(keys), len(hash_keys)) for rec in raw[:-1] or raw]"),),
        ("tests/integration/test_aggregation.py",),
    ),
    Defect(
        "commit-backwards", "a commit behind the stored position is not refused",
        (("kinesis_source/checkpoints/store.py", "            if k in known and advances(known[k].position, p)",
          "            if False and k in known and advances(known[k].position, p)"),),
        ("tests/integration/test_checkpoint_store.py",),
    ),
    Defect(
        "offsets-not-canonical", "offsets serialized without sorted keys",
        (("kinesis_source/positions.py",
          '        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))',
          '        return json.dumps({"version": self.to_dict()["version"],'
          ' "shards": dict(reversed(list(self._texts.items())))}, separators=(",", ":"))'),),
    ),
    Defect(
        "expired-iterator-not-renewed", "an expired iterator is not re-derived",
        (("kinesis_source/aws/kinesis.py", "    return error_code(exc) == EXPIRED_ITERATOR",
          "    return False"),),
        ("tests/integration/test_iterator_expiry.py", "tests/integration/test_zz_iterator_expiry.py"),
    ),
    Defect(
        "throttle-not-retried", "a throttled GetRecords is not tried again",
        (("kinesis_source/aws/kinesis.py", '        "retry": retry_if_exception(is_throttled),',
          '        "retry": retry_if_exception(lambda exc: False),'),),
        ("tests/integration/test_faults.py",),
    ),
)


def _copy(repo: Path) -> Path:
    """A throwaway copy of ``repo``'s tracked files, with this checkout's environments."""
    dest = Path(tempfile.mkdtemp(prefix="planted-"))
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(dest / "repo")], check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "-C", str(dest / "repo"), "checkout", "-q", head], check=True)
    for env in (".venv-clean", ".venv-pyspark40", "tests/kinesis_local/node_modules"):
        if (HERE / env).exists() and not (dest / "repo" / env).exists():
            (dest / "repo" / env).symlink_to(HERE / env)
    return dest / "repo"


def _apply(root: Path, defect: Defect) -> bool:
    for path, text, new in defect.edits:
        source = (root / path).read_text()
        if source.count(text) != 1:
            return False
        (root / path).write_text(source.replace(text, new))
    return True


def _pytest(root: Path, args: list[str], timeout: float) -> tuple[bool, str, float]:
    """Run pytest in ``root`` (its own package first on every path); (failed, summary, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYSPARK_PYTHON": str(HERE / ".venv/bin/python"),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("KDDB_TEST_CALLBACK_DIR", None)
    started = time.monotonic()
    try:
        out = subprocess.run([str(HERE / ".venv/bin/python"), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              "--durations=0", *args], cwd=root, env=env, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, "timed out", time.monotonic() - started
    lines = [x for x in out.stdout.splitlines() if x.startswith(("FAILED", "ERROR"))]
    return out.returncode != 0, (lines[0] if lines else out.stdout.strip().splitlines()[-1]), time.monotonic() - started


def try_defect(repo: Path, defect: Defect, skip_unit: bool = False) -> dict:
    """Plant ``defect`` in a copy of ``repo`` and run its suite's guards; what caught it
    (``skip_unit``: only the tests named for it, to see that they catch it too)."""
    root = _copy(repo)
    try:
        if not _apply(root, defect):
            return {"defect": defect.name, "caught": None, "by": "not applicable (text not found)"}
        check = subprocess.run(
            [str(HERE / ".venv/bin/python"), "-c", "import kinesis_source; print(kinesis_source.__file__)"],
            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True)
        assert check.stdout.startswith(str(root)), f"the copy's package is not the one imported: {check.stdout}"
        took = 0.0
        if not skip_unit:
            failed, summary, took = _pytest(root, ["tests/unit"], 900)
            if failed:
                return {"defect": defect.name, "caught": True, "by": summary, "stage": "unit", "s": round(took)}
        tests = [t for t in defect.tests if (root / t.split("::")[0]).exists()]
        if not tests:
            return {"defect": defect.name, "caught": None if skip_unit else False,
                    "by": "no other test named" if skip_unit else "unit tests passed; no other test named"}
        failed, summary, more = _pytest(root, tests, 1800)
        return {"defect": defect.name, "caught": failed, "by": summary, "stage": " ".join(tests),
                "s": round(took + more)}
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def main() -> None:
    """Try every defect (or ``--only`` some) on ``--repo``'s suite; print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--skip-unit", action="store_true",
                        help="run only the tests named for each defect (do they catch it too?)")
    args = parser.parse_args()
    for defect in DEFECTS:
        if args.only and defect.name not in args.only:
            continue
        result = {"repo": str(args.repo), "what": defect.what, **try_defect(args.repo, defect, args.skip_unit)}
        line = json.dumps(result, sort_keys=True)
        print(line, flush=True)
        if args.report:
            with args.report.open("a") as fh:
                fh.write(line + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
