"""docs/options.md is generated from the option declarations and must not drift."""

from pathlib import Path

from kinesis_source.options import option_specs, options_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"


def test_options_doc_is_up_to_date():
    assert DOC.read_text() == options_markdown(), (
        "docs/options.md is out of date: run `python -m kinesis_source.options > docs/options.md`"
    )


def test_options_doc_lists_every_option():
    text = DOC.read_text()
    for spec in option_specs():
        assert f"| `{spec['key']}` |" in text
