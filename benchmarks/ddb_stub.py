"""A minimal in-memory DynamoDB on 127.0.0.1 for the commit benchmark: just what
``CheckpointStore`` calls (DescribeTable, CreateTable, UpdateItem, GetItem, Query,
TransactWriteItems), answered at once.

Why besides moto: moto's TransactWriteItems deep-copies the whole table once per item of the
transaction (moto 5), so with one item per shard (checkpoint format 1) a 1,000-shard commit took
50-90 s on it, which measured moto and nothing of ours. This stub keeps DynamoDB's limits that matter
here (at most 100 items per transaction,
one operation per item) and applies writes without evaluating conditions, so a commit's wall time
on it is the client side's own cost: building, signing and sending the calls.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_server import LocalService

_TABLE_DESC = {
    "KeySchema": [
        {"AttributeName": "app", "KeyType": "HASH"},
        {"AttributeName": "key", "KeyType": "RANGE"},
    ],
    "AttributeDefinitions": [
        {"AttributeName": "app", "AttributeType": "S"},
        {"AttributeName": "key", "AttributeType": "S"},
    ],
    "TableStatus": "ACTIVE",
}
MAX_TRANSACT_ITEMS = 100


class DynamoStub(LocalService):
    """``with DynamoStub() as stub: stub.url``; ``stub.calls`` lists (operation, items).
    ``latency`` (seconds) is slept before every answer (a region's round trip, no CPU)."""

    def __init__(self, latency: float = 0.0) -> None:
        self.latency = latency
        self.calls: list[tuple[str, int]] = []
        self._items: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._tables: set[str] = set()
        self._lock = threading.Lock()
        super().__init__(self._handler())

    # -- operations ----------------------------------------------------------------------

    def answer(self, op: str, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Status and body for one request."""
        table = req.get("TableName")
        with self._lock:
            if op == "DescribeTable":
                if table not in self._tables:
                    return 400, _error("ResourceNotFoundException", f"table {table} not found")
                return 200, {"Table": {"TableName": table, **_TABLE_DESC}}
            if op == "CreateTable":
                self._tables.add(table)
                return 200, {"TableDescription": {"TableName": table, **_TABLE_DESC}}
            if op == "UpdateItem":
                return 200, {"Attributes": self._update(table, req)}
            if op == "GetItem":
                item = self._items.get(_key(table, req["Key"]))
                return 200, ({"Item": item} if item else {})
            if op == "Query":
                app = req["ExpressionAttributeValues"][":a"]["S"]
                items = [v for (t, a, _), v in sorted(self._items.items()) if t == table and a == app]
                return 200, {"Items": items, "Count": len(items)}
            if op == "TransactWriteItems":
                return self._transact(req["TransactItems"])
        return 400, _error("UnknownOperationException", op)

    def _update(self, table: str, req: dict[str, Any]) -> dict[str, Any]:
        key = _key(table, req["Key"])
        item = self._items.setdefault(key, dict(req["Key"]))
        values = req.get("ExpressionAttributeValues", {})
        if "epoch = if_not_exists" in req["UpdateExpression"]:  # a claim bumps the epoch
            item["epoch"] = {"N": str(int(item.get("epoch", {"N": "0"})["N"]) + 1)}
        if ":o" in values:
            item["owner"] = values[":o"]
        return item

    def _transact(self, items: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        if len(items) > MAX_TRANSACT_ITEMS:
            return 400, _error("ValidationException", "more than 100 items in a transaction")
        seen = set()
        for entry in items:
            (kind, op), = entry.items()
            raw_key = op["Item"] if kind == "Put" else op["Key"]
            key = _key(op["TableName"], raw_key)
            if key in seen:
                return 400, _error("ValidationException", "two operations on one item")
            seen.add(key)
            if kind == "Put":
                self._items[key] = op["Item"]
            elif kind == "Delete":
                self._items.pop(key, None)
        return 200, {}

    # -- HTTP ----------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # one answer, no 40 ms delayed-ACK stall

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                op = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
                req = json.loads(body or b"{}")
                stub.calls.append((op, len(req.get("TransactItems", []))))
                if stub.latency > 0:
                    time.sleep(stub.latency)  # the handler's own thread: others are answered meanwhile
                status, answer = stub.answer(op, req)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _key(table: str, item: dict[str, Any]) -> tuple[str, str, str]:
    return (table, item["app"]["S"], item["key"]["S"])


def _error(code: str, message: str) -> dict[str, str]:
    return {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": message}
