"""Where ``latestOffset`` goes: the modules one steady-state answer passes through (issue 48).

The source's reader, its planner on the unit tests' in-memory Kinesis (4 shards, tip reports
off) and its checkpointer on an in-memory store, answers; records arrive on one shard and the
table learns them; then the reader's next ``latestOffset(start)``, which hands them out, is
traced (``sys.setprofile``: every call into a
``kinesis_source`` function in that thread). Printed, as JSON:

- ``modules``: the distinct modules entered;
- ``climbs``: calls from a module into one that imports it, directly or not (a call back up
  the dependency order: a callback, or a layer reaching back into one it was called from);
- ``sideways``: calls into a module the caller does not import either way (an object handed
  in: a duck-typed dependency);
- ``reentries``: calls back into a module that is still on the stack below the caller;
- ``path``: the modules in the order entered, consecutive repeats folded; and the distinct
  calls of each kind.

    python -m tests.support.offset_path [--repo PATH]

``--repo``: the checkout whose ``kinesis_source`` is traced (default: this one), to compare a
change with its base. The unit tests' fakes come from this checkout.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]


def imports(root: Path) -> dict[str, set[str]]:
    """Each ``kinesis_source`` module's imports of other ``kinesis_source`` modules."""
    out: dict[str, set[str]] = {}
    for path in (root / "kinesis_source").rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        found = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue  # (annotations only: no call goes that way)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kinesis_source"):
                if node.module != "kinesis_source":  # (from the package: its modules, not its __init__)
                    found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("kinesis_source"))
        out[name] = found
    return {m: {d for d in deps if d in out and d != m} for m, deps in out.items()}


def above(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """For each module, the modules that import it, directly or not."""
    users: dict[str, set[str]] = {m: set() for m in graph}
    for m, deps in graph.items():
        for d in deps:
            users[d].add(m)
    closed: dict[str, set[str]] = {}
    for m in graph:
        seen, todo = set(), list(users[m])
        while todo:
            u = todo.pop()
            if u not in seen:
                seen.add(u)
                todo.extend(users[u])
        closed[m] = seen
    return closed


TRACE = r"""
import json, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(1, {here!r})
from kinesis_source import source
from kinesis_source.aws.kinesis import AsyncKinesis
from kinesis_source.driver.application import Application
from kinesis_source.driver.commits import Checkpointer
from kinesis_source.driver.planner import Planner
from kinesis_source.options import SourceOptions
from kinesis_source.positions import Offset, Position, ShardId
from tests.unit.fake_kinesis import AsyncFake, FakeKinesis, FakeShard, log_of
from tests.unit.test_committer import Listing, MemoryStore
from tests.unit.test_source import NoStreamEnters
assert __import__("kinesis_source").__file__.startswith({root!r})

shards = {{f"s{{i}}": FakeShard(log_of(20, offset=i)) for i in range(4)}}
fake = FakeKinesis(shards)
opts = SourceOptions.parse({{"streamName": "s", "applicationName": "app", "region": "us-east-1",
                             "tipReports": "false", "minProbeIntervalMs": "100",
                             "dynamodbEndpointUrl": "http://127.0.0.1:9"}})  # (the store is replaced)
planner = Planner(opts, AsyncKinesis(AsyncFake(fake)))
app = Application(opts, MemoryStore(), Listing([]), owner="path")
app.epoch = 1
reader = source.KinesisStreamReader(opts, planner=planner)
reader._checkpointer, reader._start = Checkpointer(app), NoStreamEnters()
start = Offset({{ShardId("s", k): Position.trim_horizon() for k in shards}})
end = Offset.from_dict(reader.latestOffset(start.to_dict()))
reader.checkpointer.before_batch()
assert end != start, "the first answer found no records"
last_seq, last_at = shards["s0"].records[-1]
more = [(str(int(last_seq) + 7 * k), last_at + 0.01 * k) for k in range(1, 6)]
shards["s0"].records.extend(more)
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    parts = getattr(planner, "parts", None)  # (before issue 48: the planner's own _tips)
    table = parts.tips if parts is not None else getattr(planner, "_tips", None)
    view = table.entries[ShardId("s", "s0")] if table is not None else None
    if view is not None and view.tip == more[-1][0]:
        break
    time.sleep(0.05)
else:
    raise SystemExit("the table did not learn the new records")
calls = []
def profile(frame, event, arg):
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        if name.startswith("kinesis_source"):
            # the kinesis_source modules on the stack below, nearest first
            below, f = [], frame.f_back
            while f is not None:
                m = f.f_globals.get("__name__", "")
                if m.startswith("kinesis_source") and (not below or below[-1] != m):
                    below.append(m)
                f = f.f_back
            calls.append((name, frame.f_code.co_name, below))
sys.setprofile(profile)
try:
    answer = reader.latestOffset(end.to_dict())
finally:
    sys.setprofile(None)
reader.checkpointer.close()
planner.close()
print(json.dumps({{"calls": calls, "moved": answer != end.to_dict()}}))
"""


def trace(root: Path) -> dict:
    """The traced calls of one steady-state answer in ``root``'s checkout, and the metrics."""
    out = subprocess.run([sys.executable, "-c", TRACE.format(root=str(root), here=str(HERE))],
                         capture_output=True, text=True, cwd=root, timeout=120)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    found = json.loads(out.stdout.strip().splitlines()[-1])
    ups = above(imports(root))
    path: list[str] = []
    climbs, sideways, reentries = [], [], []
    for module, function, below in found["calls"]:
        if not path or path[-1] != module:
            path.append(module)
        caller = below[0] if below else None
        if caller is None or caller == module:
            continue
        call = f"{caller} -> {module}.{function}"
        if module in ups[caller]:
            climbs.append(call)  # into a module that imports the caller: back up a layer
        elif caller not in ups[module]:
            sideways.append(call)  # into a module the caller does not import (an object handed in)
        if module in below[1:]:
            reentries.append(call)  # back into a module still on the stack below
    return {"modules": len(set(path)), "climbs": len(climbs), "sideways": len(sideways),
            "reentries": len(reentries), "calls": len(found["calls"]), "moved": found["moved"],
            "path": path, "climbed": sorted(set(climbs)), "sideways_calls": sorted(set(sideways)),
            "reentered": sorted(set(reentries))}


def main() -> None:
    """Print the metrics of ``--repo``'s steady-state answer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=HERE)
    args = parser.parse_args()
    print(json.dumps(trace(args.repo.resolve()), indent=1))


if __name__ == "__main__":
    main()
