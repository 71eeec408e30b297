"""What the sink takes in: the columns it needs, checked once on the driver, and each row
turned into a :class:`UserRecord`, checked against Kinesis' record rules on the executor.

Columns (names matched case-insensitively, as Spark resolves them): ``data`` (binary, or string
written as UTF-8), ``partitionKey`` (string) and, optionally, ``explicitHashKey`` (string, a
decimal 128-bit hash key that routes the record instead of the partition key's MD5). Any other
column is an error rather than silently left out: a frame meant for another sink (``value``,
``key``) must not lose its payload unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kinesis_source.errors import SinkInputError
from kinesis_source.kpl import effective_hash_key

DATA, PARTITION_KEY, EXPLICIT_HASH_KEY = "data", "partitionKey", "explicitHashKey"
MAX_RECORD_BYTES = 1024 * 1024  # data and partition key together
MAX_KEY_CHARS = 256
MAX_HASH_KEY = 2**128 - 1


@dataclass(frozen=True)
class Columns:
    """Where the sink's columns are in the input, as the schema names them."""

    data: str
    data_is_text: bool
    partition_key: str
    explicit_hash_key: str | None

    @property
    def names(self) -> list[str]:
        """The input columns, in the order a row is read."""
        return [self.data, self.partition_key] + ([self.explicit_hash_key] if self.explicit_hash_key else [])


def check_schema(schema: Any, stream: str) -> Columns:
    """The sink's columns in ``schema`` (a pyspark ``StructType``), or the error that says what
    is missing, mistyped or extra."""
    from pyspark.sql.types import BinaryType, StringType

    by_name = {f.name.lower(): f for f in schema.fields}
    where = f"Writing to Kinesis stream '{stream}'"
    wanted = f"'{DATA}' (binary or string), '{PARTITION_KEY}' (string) and optionally '{EXPLICIT_HASH_KEY}' (string)"
    missing = [c for c in (DATA, PARTITION_KEY) if c.lower() not in by_name]
    if missing:
        has = ", ".join(f"'{f.name}'" for f in schema.fields) or "none"
        raise SinkInputError(
            f"{where} needs column{'s' if len(missing) > 1 else ''} "
            f"{' and '.join(repr(c) for c in missing)}: the input has {has}. Select or rename "
            f"columns into {wanted}."
        )
    ours = {c.lower() for c in (DATA, PARTITION_KEY, EXPLICIT_HASH_KEY)}
    extra = [f.name for f in schema.fields if f.name.lower() not in ours]
    if extra:
        raise SinkInputError(
            f"{where} takes only {wanted}; the input also has {', '.join(repr(c) for c in extra)}. "
            "Select the sink's columns (put anything else into 'data', e.g. with to_json)."
        )

    def typed(name: str, *types: Any) -> str:
        f = by_name[name.lower()]
        if not isinstance(f.dataType, types):
            shown = " or ".join(t.typeName() for t in types)
            raise SinkInputError(
                f"{where}: column '{f.name}' is {f.dataType.simpleString()}, it must be {shown}. "
                f"Cast it (e.g. col('{f.name}').cast('{types[-1].typeName()}'))."
            )
        return f.name

    data = typed(DATA, BinaryType, StringType)
    return Columns(
        data=data,
        data_is_text=isinstance(by_name[DATA].dataType, StringType),
        partition_key=typed(PARTITION_KEY, StringType),
        explicit_hash_key=typed(EXPLICIT_HASH_KEY, StringType) if EXPLICIT_HASH_KEY.lower() in by_name else None,
    )


@dataclass(frozen=True)
class UserRecord:
    """One row to write: its place among the task's rows, and what Kinesis needs."""

    row: int  # 0-based, in the task's input order
    partition_key: str
    data: bytes
    explicit_hash_key: str | None
    hash_key: int  # where Kinesis routes it (explicit hash key, else MD5 of the partition key)
    size: int  # bytes Kinesis counts: data and partition key

    def entry(self) -> dict[str, Any]:
        """This record as one entry of a ``PutRecords`` request."""
        out: dict[str, Any] = {"Data": self.data, "PartitionKey": self.partition_key}
        if self.explicit_hash_key is not None:
            out["ExplicitHashKey"] = self.explicit_hash_key
        return out


def user_record(row: int, key: Any, data: Any, hash_key: Any, columns: Columns, stream: str) -> UserRecord:
    """One row as a record, or the error naming the row, the column and the rule it breaks."""

    def bad(column: str, why: str) -> SinkInputError:
        return SinkInputError(
            f"Row {row} of this task cannot be written to Kinesis stream '{stream}': column "
            f"'{column}' {why}. Rows before it may have been written (writes are at least once)."
        )

    if key is None:
        raise bad(columns.partition_key, f"is null; a record needs a partition key of 1-{MAX_KEY_CHARS} characters")
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        raise bad(columns.partition_key, f"has {len(key)} characters; Kinesis takes 1-{MAX_KEY_CHARS}")
    if data is None:
        raise bad(columns.data, "is null; write an empty value instead if that is meant")
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = bytes(data)
    size = len(data) + len(key.encode())
    if size > MAX_RECORD_BYTES:
        raise bad(
            columns.data,
            f"makes a record of {size} bytes with its partition key; Kinesis takes at most {MAX_RECORD_BYTES}",
        )
    if hash_key is not None:
        if not (hash_key.isascii() and hash_key.isdigit() and int(hash_key) <= MAX_HASH_KEY):
            raise bad(
                columns.explicit_hash_key or EXPLICIT_HASH_KEY,
                f"is {hash_key!r}; it must be a decimal integer from 0 to 2^128-1",
            )
        hash_key = str(int(hash_key))
    return UserRecord(row, key, data, hash_key, effective_hash_key(key, hash_key), size)


def from_arrow(batches: Iterable[Any], columns: Columns, stream: str) -> Iterator[UserRecord]:
    """The records of Arrow record batches (the Arrow writers' input), in row order."""
    row = 0
    for batch in batches:
        keys = batch.column(columns.partition_key).to_pylist()
        datas = batch.column(columns.data).to_pylist()
        hashes = (
            batch.column(columns.explicit_hash_key).to_pylist() if columns.explicit_hash_key else [None] * len(keys)
        )
        for key, data, hash_key in zip(keys, datas, hashes, strict=True):
            yield user_record(row, key, data, hash_key, columns, stream)
            row += 1


def from_rows(rows: Iterable[Any], columns: Columns, stream: str) -> Iterator[UserRecord]:
    """The records of Spark ``Row``s (the row writers' input, on pyspark without the Arrow
    stream writer), in order."""
    for row, values in enumerate(rows):
        hash_key = values[columns.explicit_hash_key] if columns.explicit_hash_key else None
        yield user_record(row, values[columns.partition_key], values[columns.data], hash_key, columns, stream)
