"""DynamoDB's item sizes and write units, for the write-unit figure each commit records.

DynamoDB sizes an item as the sum of its attribute names' and values' lengths (strings in
UTF-8, binaries raw, numbers about one byte per two digits plus one), and a write costs one unit
per KB started of the larger of the item before and after it; in a transaction, two. This is the
writer's own estimate, stored beside each commit for ``kinesis-ddb status``; the ``cost``
benchmark counts at a DynamoDB front with its own sizing instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

KB = 1024


def value_bytes(value: Mapping[str, Any]) -> int:
    """Size of one attribute value (the client's attribute-value form)."""
    (kind, raw), = value.items()
    if kind == "S":
        return len(raw.encode())
    if kind == "B":
        return len(raw)
    if kind == "N":
        digits = raw.lstrip("-").replace(".", "").strip("0") or "0"
        return math.ceil(len(digits) / 2) + 1
    if kind in ("BOOL", "NULL"):
        return 1
    raise ValueError(f"attribute type {kind} is not one the checkpoint store writes")


def item_bytes(item: Mapping[str, Mapping[str, Any]]) -> int:
    """Size of an item (names and values)."""
    return sum(len(name.encode()) + value_bytes(value) for name, value in item.items())


def write_units(size: int, transactional: bool = False) -> int:
    """Units of one write of an item of ``size`` bytes (the larger of before and after)."""
    units = max(1, math.ceil(size / KB))
    return 2 * units if transactional else units
