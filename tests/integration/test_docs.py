"""The docs hang together (the quickstart's runnable example is run by test_install_routes.py)."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_doc_is_linked_from_the_readme():
    readme = (DOCS.parent / "README.md").read_text()
    for doc in DOCS.glob("*.md"):
        assert f"docs/{doc.name}" in readme, f"README does not link docs/{doc.name}"
