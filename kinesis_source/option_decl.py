"""How options are declared, parsed and documented, for the source and the sink alike.

An option is one field of a frozen dataclass (:class:`~kinesis_source.options.SourceOptions`,
:class:`~kinesis_source.sink.options.SinkOptions`) whose metadata holds the option key, its type
as shown to users, its default, its description and the parser that validates it. The docs
tables are generated from these declarations (:func:`markdown_table`) and tests keep the files
in step.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any, TypeVar, cast

from kinesis_source.errors import OptionError

T = TypeVar("T")

# Prefixes users carry over from Spark configs and the other connectors.
_PREFIXES = ("spark.kinesis.", "kinesis.", "aws.", "spark.")


def option(
    key: str,
    type_name: str,
    default: Any,
    doc: str,
    parse: Callable[[str], Any],
    *,
    required: bool = False,
    secret: bool = False,
) -> Any:
    """One option's declaration, as a dataclass field (secrets are left out of ``repr``)."""
    meta = {
        "key": key,
        "type": type_name,
        "doc": doc,
        "parse": parse,
        "required": required,
        "secret": secret,
    }
    return field(default=default, metadata=meta, repr=not secret)


def ordered_fields(cls: type) -> list[Any]:
    """``cls``'s option fields, its own first, then those it inherits (the shared connection
    options), each group in declaration order."""
    own = cls.__dict__.get("__annotations__", {})
    mine = [f for f in fields(cls) if f.name in own]
    return mine + [f for f in fields(cls) if f.name not in own]


def parse_options(
    cls: type[T], raw: Mapping[str, str], role: str, elsewhere: Mapping[str, str] | None = None
) -> T:
    """Validate Spark's option map (keys case-insensitive) into a frozen ``cls``.

    ``role`` says what the options are for in errors ("reading", "writing"); ``elsewhere``
    holds the keys (lower case -> key) of options that exist only for the other role, so that
    such a key is named as that, not as a typo.
    """
    specs = {f.metadata["key"].lower(): f for f in fields(cast(Any, cls))}
    values: dict[str, Any] = {}
    for key, text in raw.items():
        spec = specs.get(key.lower())
        if spec is None:
            if elsewhere and key.lower() in elsewhere:
                raise OptionError(
                    f"Option '{elsewhere[key.lower()]}' is not an option for {role} with format kinesis-ddb "
                    "(`kinesis-ddb options` lists every option, by role): leave it out"
                )
            known = {k: f.metadata["key"] for k, f in specs.items()}
            raise OptionError(
                f"Unknown option '{key}' for {role} with format kinesis-ddb"
                f"{_suggestion(key, known)} (`kinesis-ddb options` lists every option)"
            )
        values[spec.name] = _parse_one(spec, text)
    for f in fields(cast(Any, cls)):
        if f.metadata["required"] and f.name not in values:
            raise OptionError(f"Option '{f.metadata['key']}' is required: {f.metadata['doc']}")
    return cls(**values)


def _suggestion(key: str, known: Mapping[str, str]) -> str:
    """What to write instead of an unknown option ``key`` ('' if nothing fits), given our
    options by lower-case name."""
    from kinesis_source.peers import hint

    peer = hint(key, set(known))
    if peer:
        return peer
    lower = key.lower()
    bare = next((lower[len(p):] for p in _PREFIXES if lower.startswith(p)), lower)
    if bare in known:
        return f": options take no prefix here, use '{known[bare]}'"
    close = difflib.get_close_matches(bare, list(known), n=1, cutoff=0.75)
    return f"; did you mean '{known[close[0]]}'?" if close else ""


def _parse_one(spec: Any, text: Any) -> Any:
    key = spec.metadata["key"]
    shown = "<redacted>" if spec.metadata["secret"] else repr(text)
    if not isinstance(text, str):
        raise OptionError(f"Option '{key}' = {shown} is invalid: must be a string")
    try:
        return spec.metadata["parse"](text)
    except OptionError:  # the parser named the option itself
        raise
    except ValueError as exc:
        raise OptionError(f"Option '{key}' = {shown} is invalid: {exc}") from None


def specs_of(cls: type) -> list[dict[str, Any]]:
    """``cls``'s declarations, in table order, as plain dicts (key, type, default, doc,
    required)."""
    out = []
    for f in ordered_fields(cls):
        default = f.default
        if isinstance(default, bool):
            default = str(default).lower()
        out.append(
            {
                "key": f.metadata["key"],
                "type": f.metadata["type"],
                "default": None if default is None else str(default),
                "doc": f.metadata["doc"],
                "required": f.metadata["required"],
            }
        )
    return out


def markdown_table(cls: type) -> list[str]:
    """The lines of ``cls``'s options table in Markdown."""
    lines = ["| option | type | default | description |", "|---|---|---|---|"]
    for spec in specs_of(cls):
        default = "(required)" if spec["required"] else (
            "(none)" if spec["default"] is None else f"`{spec['default']}`"
        )
        lines.append(f"| `{spec['key']}` | {spec['type']} | {default} | {spec['doc']} |")
    return lines
