"""What the docs say of the code, where a test can hold them to it: the index of the
decision records lists each record once, and the architecture counts the services there
are."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions"


def test_the_decisions_index_lists_every_record_once() -> None:
    index = (DECISIONS / "README.md").read_text()
    linked = re.findall(r"\]\((\d{4}-[\w-]+\.md)\)", index)
    records = sorted(p.name for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert sorted(linked) == records
    assert len(set(linked)) == len(linked)


def test_the_architecture_counts_the_services_there_are() -> None:
    services = sorted(p.name for p in (ROOT / "services").iterdir()
                      if p.is_dir() and (p / "service.py").exists())
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = re.findall(r"^\| (\w+)(?: \(optional\))? \| `", text, re.MULTILINE)
    assert sorted(table) == services
    words = {4: "four", 5: "five", 6: "six"}
    assert f"cronstream is {words[len(services)]} services" in text
