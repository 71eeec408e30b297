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


def test_migration_tables_are_generated_from_the_peer_declarations():
    from kinesis_source.peers import migration_markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "migration.md").read_text()
    start, end = "<!-- peer options: generated", "<!-- end of peer options -->"
    assert start in text and end in text
    block = text[text.index(start):text.index(end)]
    assert migration_markdown() in block, (
        "docs/migration.md's option tables are out of date: paste `python -m kinesis_source.peers`"
    )


def test_every_peer_option_names_one_of_ours_or_says_why_not():
    from kinesis_source.options import option_specs
    from kinesis_source.peers import CONNECTORS

    ours = {spec["key"] for spec in option_specs()}
    for _, _, options in CONNECTORS:
        for option in options:
            assert option.ours in ours if option.ours else option.note, option


def test_the_sink_options_table_is_generated_from_the_declarations():
    from kinesis_source.sink.options import options_markdown as sink_markdown

    text = (Path(__file__).resolve().parents[2] / "docs" / "sink.md").read_text()
    start, end = "<!-- sink options: generated", "<!-- end of sink options -->"
    assert start in text and end in text
    assert sink_markdown() in text[text.index(start):text.index(end)], (
        "docs/sink.md's options table is out of date: paste `python -m kinesis_source.sink.options`"
    )
