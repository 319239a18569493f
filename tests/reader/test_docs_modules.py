"""docs/reader.md's Modules section names every module of sortpack/reader/, and nothing that is not there."""
from __future__ import annotations

import re

from support import ROOT


def test_reader_md_names_every_reader_module():
    text = (ROOT / "docs" / "reader.md").read_text()
    section = text[text.index("## Modules"):]
    section = section[:section.find("\n## ", 1) if "\n## " in section[1:] else len(section)]
    named = set(re.findall(r"`([a-z_]+)\.py`", section))  # bare names: the reader's own modules
    modules = {p.stem for p in (ROOT / "sortpack" / "reader").glob("*.py") if p.stem != "__init__"}
    assert modules - named == set(), f"reader modules docs/reader.md does not describe: {sorted(modules - named)}"
    assert named - modules == set(), f"docs/reader.md names modules sortpack/reader/ lacks: {sorted(named - modules)}"
