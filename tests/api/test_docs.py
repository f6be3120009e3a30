"""The user docs stay short, their links resolve, and the key reference has one line per key.

User pages (docs/*.md) hold what a user needs; tuning narratives, long evidence tables and
measurements in full live in docs/reports/, linked from the pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "docker" / "README.md", *sorted(DOCS.rglob("*.md"))]
METHOD_PAGES = ["fedcref.md", "emdcfl.md", "fedfcm.md", "exact-fcm.md"]
FENCE = re.compile(r"```.*?```", re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*$", FENCE.sub("", page.read_text()), re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _links(page: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text()))
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", link)]


def test_user_pages_stay_short():
    """Markdown in docs/ outside docs/reports/ is at most 120 KB; a method page at most 15 KB."""
    sizes = {p.name: p.stat().st_size for p in DOCS.glob("*.md")}
    assert sum(sizes.values()) <= 120_000, sorted(sizes.items(), key=lambda kv: -kv[1])
    assert {name: sizes[name] for name in METHOD_PAGES if sizes[name] > 15_000} == {}


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for link in _links(page):
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert broken == []


def test_the_anchor_rule_is_githubs():
    assert _slug("Paper 003 (FedFCM + FedFuzzDB), Tables 1–2: the example") == \
        "paper-003-fedfcm--fedfuzzdb-tables-12-the-example"
    assert _slug("Choosing ε") == "choosing-ε"
    assert _slug("Your own files (`dataset=\"files\"`)") == "your-own-files-datasetfiles"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_no_machine_paths(page):
    found = re.findall(r"(?<![\w.~])/(?:work|root|home/\w+)/\S*", page.read_text())
    assert found == []


def test_the_key_reference_has_one_line_per_key():
    """docs/run-config.md's tables: one row per key, four cells each (a `|` inside a help text
    is escaped, so it cannot split a row)."""
    from fedclust.config import all_keys, render_readme_keys

    rows = [line for line in render_readme_keys().splitlines()
            if line.startswith("| `") and not line.startswith("| key")]
    assert len(rows) == len(list(all_keys()))
    cells = [len(re.split(r"(?<!\\)\|", row)) - 2 for row in rows]
    assert set(cells) == {4}, [row for row, n in zip(rows, cells) if n != 4]
