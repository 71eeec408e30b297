"""docs/operations.md's AWS call table and IAM policies say exactly what the code calls.

The code's calls are found statically: every method call whose name is an operation of the
Kinesis, DynamoDB or STS client (botocore's own model gives the names), every paginator, and the
parts of DynamoDB transactions (``Put``/``Update``/``Delete``/``ConditionCheck``), which IAM
authorizes as PutItem/UpdateItem/DeleteItem/ConditionCheckItem. The query's code is the package
without ``tools/``; the command's is ``tools/``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import botocore.session
from botocore import xform_name

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "kinesis_source"
OPERATIONS = (REPO / "docs" / "operations.md").read_text()
SERVICES = {"kinesis": "Kinesis", "dynamodb": "DynamoDB", "sts": "STS"}
TRANSACTION_PARTS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                     "ConditionCheck": "ConditionCheckItem"}


def _operations() -> dict[str, tuple[str, str]]:
    session = botocore.session.get_session()
    ops: dict[str, tuple[str, str]] = {}
    for service in SERVICES:
        for op in session.get_service_model(service).operation_names:
            ops.setdefault(xform_name(op), (service, op))
    return ops


def calls(paths: list[Path], helpers: bool = False) -> set[str]:
    """``service:Operation`` for every AWS operation the files call (``helpers``: also calls of
    plain functions named like an operation, such as ``aws.kinesis.list_shards``)."""
    ops = _operations()
    found: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if helpers and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ops:
                found.add("{}:{}".format(*ops[node.func.id]))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if name == "get_paginator" and isinstance(node.args[0], ast.Constant):
                    name = node.args[0].value
                if name in ops:
                    found.add("{}:{}".format(*ops[name]))
            if isinstance(node, ast.Name) and node.id in ("AssumeRoleCredentialFetcher",
                                                          "AioAssumeRoleCredentialFetcher"):
                found.add("sts:AssumeRole")
            if isinstance(node, ast.Dict) and "dynamodb:TransactWriteItems" in found | _transacts(tree):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and key.value in TRANSACTION_PARTS:
                        found.add(f"dynamodb:{TRANSACTION_PARTS[key.value]}")
    return found


def _transacts(tree: ast.AST) -> set[str]:
    return {"dynamodb:TransactWriteItems" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr == "transact_write_items"}


def query_calls() -> set[str]:
    return calls([p for p in PACKAGE.rglob("*.py") if "tools" not in p.parts and "sink" not in p.parts])


def sink_calls() -> set[str]:
    return calls(list((PACKAGE / "sink").rglob("*.py")), helpers=True)


def command_calls() -> set[str]:
    return calls(list((PACKAGE / "tools").rglob("*.py")))


def section(title: str, doc: str = OPERATIONS) -> str:
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return doc[start:end if end > 0 else None]


def table_calls(text: str) -> set[str]:
    """``service:Op`` named in the first column of a markdown table: "Kinesis `A` (+ `B`)"."""
    named: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| API"):
            continue
        cell = line.split("|")[1]
        service = next((s for s, word in SERVICES.items() if cell.strip().startswith(word)), None)
        if service:
            named |= {f"{service}:{op}" for op in re.findall(r"`([A-Z]\w+)`", cell)}
    return named


def policy_actions(text: str) -> set[str]:
    """Every action of the JSON policies in ``text``."""
    actions: set[str] = set()
    for block in re.findall(r"```json\n(.*?)```", text, flags=re.S):
        for statement in json.loads(block)["Statement"]:
            actions |= set(statement["Action"])
    return actions


def iam(called: set[str]) -> set[str]:
    """The IAM actions ``called`` needs (a transaction is authorized by its parts; STS'
    AssumeRole by the role's trust policy, not by the reader's)."""
    return {c for c in called if c not in ("dynamodb:TransactWriteItems", "sts:AssumeRole")}


def test_the_scan_finds_the_calls_it_must():
    called = query_calls()
    assert {"kinesis:GetRecords", "kinesis:SubscribeToShard", "dynamodb:TransactWriteItems",
            "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem", "sts:AssumeRole"} <= called


def test_the_call_table_names_every_call_of_the_query_and_no_other():
    assert table_calls(section("AWS calls")) == query_calls()


def test_the_iam_policies_grant_what_the_query_calls_and_nothing_else():
    assert policy_actions(section("Minimal IAM policy")) == iam(query_calls())


def test_the_commands_calls_are_documented_with_their_permissions():
    """The commands also call through the store and the consumers' code, so their section may
    name more than ``tools/`` calls directly, but nothing that no code calls."""
    text = section("The kinesis-ddb command's calls")
    documented = table_calls(text)
    assert command_calls() <= documented <= command_calls() | query_calls()
    assert policy_actions(text) == iam(documented)


def test_the_sinks_call_table_and_policy_name_what_the_sink_calls():
    sink_doc = (REPO / "docs" / "sink.md").read_text()
    called = sink_calls()
    assert {"kinesis:PutRecords", "kinesis:ListShards"} <= called
    assert table_calls(section("AWS calls and IAM", sink_doc)) == called
    assert policy_actions(section("AWS calls and IAM", sink_doc)) == iam(called)
