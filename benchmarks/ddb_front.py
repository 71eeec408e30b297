"""A DynamoDB front that forwards every call to a DynamoDB server (moto) and counts the capacity
units DynamoDB would bill for it, by DynamoDB's own sizing rules, not by anything the client
says.

- An item's size is the sum of its attribute names' UTF-8 lengths and its values' sizes:
  strings their UTF-8 length, binaries their raw length, numbers (significant digits + 1) / 2
  + 1, booleans and nulls 1, lists and maps 3 plus their elements plus 1 per element (and a
  map's names).
- A write costs 1 unit per KB started of the larger of the item before and after it (a delete:
  the item deleted; nothing there: 1); in ``TransactWriteItems`` 2, a ``ConditionCheck``
  included. A write refused by its condition still costs its units.
- A read costs 1 unit per 4 KB started of what it returns (a ``Query``: of all its items
  together), half when eventually consistent; at least 1 (0.5).

The sizes before and after a write are read from the server beside the call (those reads are not
counted). The counts are per operation, so the checkpoint store's commits, compactions, claims and
epoch checks each show what they cost.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.support.http_server import LocalService

KB = 1024


def value_size(value: dict[str, Any]) -> int:
    """DynamoDB's size of one attribute value, in its JSON wire form."""
    (kind, raw), = value.items()
    if kind == "S":
        return len(raw.encode())
    if kind == "B":
        return len(base64.b64decode(raw))
    if kind == "N":
        digits = raw.lstrip("-").replace(".", "").strip("0")
        return (len(digits) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(value_size({"N": n}) for n in raw)
    if kind == "BS":
        return sum(len(base64.b64decode(b)) for b in raw)
    if kind == "L":
        return 3 + sum(value_size(v) + 1 for v in raw)
    if kind == "M":
        return 3 + sum(len(k.encode()) + value_size(v) + 1 for k, v in raw.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict[str, Any] | None) -> int:
    """An item's size (0 for no item)."""
    return sum(len(k.encode()) + value_size(v) for k, v in (item or {}).items())


def write_units(before: int, after: int, transactional: bool) -> int:
    units = max(1, math.ceil(max(before, after) / KB))
    return 2 * units if transactional else units


def read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / (4 * KB)))
    return float(units) if consistent else units / 2


class SizingFront(LocalService):
    """``with SizingFront(backend_url) as front: front.url``; ``front.write_units`` and
    ``front.read_units`` count by operation (``Counter``), ``front.calls`` the calls."""

    def __init__(self, backend_url: str) -> None:
        parts = urlsplit(backend_url)
        self._backend = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.write_units: Counter[str] = Counter()
        self.read_units: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._local = threading.local()
        super().__init__(self._handler())

    def reset(self) -> None:
        """Start counting afresh."""
        with self._lock:
            self.write_units.clear()
            self.read_units.clear()
            self.calls.clear()

    # -- the backend ---------------------------------------------------------------------

    def _post(self, target: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(*self._backend, timeout=60)
        try:
            conn.request("POST", "/", body=body, headers={**headers, "X-Amz-Target": target})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except (OSError, http.client.HTTPException):
            self._local.conn = None
            conn.close()
            raise

    def _item(self, table: str, key: dict[str, Any], headers: dict[str, str]) -> dict | None:
        body = json.dumps({"TableName": table, "Key": key, "ConsistentRead": True}).encode()
        _, data = self._post("DynamoDB_20120810.GetItem", body, headers)
        return json.loads(data or b"{}").get("Item")

    # -- counting ------------------------------------------------------------------------

    def _writes(self, op: str, req: dict[str, Any]) -> list[tuple[str, dict, dict | None, bool]]:
        """(table, key, the item to write or None, transactional) of each write in a call."""
        if op == "TransactWriteItems":
            out = []
            for entry in req["TransactItems"]:
                (kind, body), = entry.items()
                key = _key_of(body.get("Key") or body["Item"])
                out.append((body["TableName"], key, body.get("Item") if kind == "Put" else None, True))
            return out
        if op in ("PutItem", "UpdateItem", "DeleteItem"):
            key = _key_of(req.get("Key") or req["Item"])
            return [(req["TableName"], key, req.get("Item"), False)]
        return []

    def _count(self, op: str, req: dict[str, Any], answer: dict[str, Any],
               before: list[int], after: list[int]) -> None:
        with self._lock:
            self.calls[op] += 1
            for old, new, (_, _, _, tx) in zip(before, after, self._writes(op, req), strict=True):
                self.write_units[op] += write_units(old, new, tx)
            consistent = bool(req.get("ConsistentRead"))
            if op == "GetItem":
                self.read_units[op] += read_units(item_size(answer.get("Item")), consistent)
            elif op == "Query":
                size = sum(item_size(i) for i in answer.get("Items", []))
                self.read_units[op] += read_units(size, consistent)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                target = self.headers.get("X-Amz-Target") or ""
                op = target.rpartition(".")[2]
                req = json.loads(body or b"{}")
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "content-length", "x-amz-target")}
                writes = front._writes(op, req)
                before = [item_size(front._item(t, k, headers)) for t, k, _, _ in writes]
                status, data = front._post(target, body, headers)
                answer = json.loads(data or b"{}")
                after = [
                    item_size(front._item(t, k, headers)) if new is None else item_size(new)
                    for t, k, new, _ in writes
                ] if status == 200 else before
                front._count(op, req, answer, before, after)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _key_of(item: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint table's primary key (``app``, ``key``) of an item or key."""
    return {"app": item["app"], "key": item["key"]}
