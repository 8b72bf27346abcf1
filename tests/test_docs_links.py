"""The README is a quick start, and every relative link in it, in docs/ and in the reports'
index leads to a file of the repository (and, with #anchor, to a heading of that file)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_LIMIT = 15_000  # bytes: a quick start, the rest lives in docs/
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)  # links inside code are examples, not links


def documents() -> list[Path]:
    found = [README, ROOT / "reports" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return found + [path for path in [ROOT / "ARCHITECTURE.md"] if path.is_file()]


def relative_links(text: str) -> list[str]:
    links = LINK.findall(CODE.sub("", text))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]  # http:, mailto:...


def anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub makes them: lower case, punctuation dropped, spaces to hyphens,
    repeated headings numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", CODE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(document: Path) -> list[str]:
    broken = []
    for link in relative_links(document.read_text()):
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            broken.append(f"{link}: no file {shown(target)}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {shown(target)}")
    return broken


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_of_the_repository(document):
    assert relative_links(document.read_text()) or document.name != "README.md", "an index links to its pages"
    assert broken_links(document) == []


def test_the_readme_is_a_quick_start():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode()):,} bytes; move detail to docs/"
    assert "auditor run" in "\n".join(text.splitlines()[:80]), "the one-line form leads the README"
    assert "make audit" in text and "make test" in text


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [here](missing.md), [this](#title), [there](#nowhere), "
                    "`[code](not-a-link.md)` and [web](https://example.org).\n")
    assert [line.split(":")[0] for line in broken_links(page)] == ["missing.md", "#nowhere"]
