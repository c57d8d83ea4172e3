"""The documentation holds together: every relative link in README.md, CONTRIBUTING.md, docs/
and dev/ (and the benchmarks' READMEs) resolves to a file or heading in the repository, nothing
links outside it but http(s), and the profile examples in docs/profiles.md load."""

import re
from pathlib import Path

import pytest

from layerslide.hwprofiles import load_profile

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md"),
               *(REPO / "dev").glob("*.md"),
               REPO / "benchmarks" / "results" / "README.md",
               REPO / "benchmarks" / "results" / "archive" / "README.md",
               REPO / "benchmarks" / "probes" / "README.md", REPO / "benchmarks" / "README.md"])
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# design docs for users must not send them outside the repository, even in prose
SELF_CONTAINED = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "docs" / "architecture.md",
                  REPO / "docs" / "data.md", REPO / "docs" / "profiles.md",
                  REPO / "docs" / "benchmarks.md", REPO / "docs" / "training.md"]


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.DOTALL | re.MULTILINE)
    found, seen = set(), {}
    for match in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.MULTILINE):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def problems_of(doc: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"https?://", target):
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            problems.append(f"{target}: only http(s) links may leave the repository")
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.is_relative_to(REPO):
            problems.append(f"{target}: outside the repository")
        elif not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{target}: no heading #{anchor} in {path.relative_to(REPO)}")
    return [f"{doc.relative_to(REPO)}: {p}" for p in problems]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_links_resolve_inside_the_repository(doc):
    assert doc.is_file()
    assert problems_of(doc) == []


def test_the_link_check_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "a.md").write_text("# Title here\n\n## Second, part\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](a.md) [ok](a.md#second-part) [web](https://example.com) "
                   "[gone](missing.md) [bad anchor](a.md#nothing) [out](../../x.md) "
                   "[mail](mailto:a@b) `[code](missing2.md)`\n```\n[fenced](missing3.md)\n```\n")
    found = problems_of(doc)
    assert [p.split(": ", 1)[1] for p in found] == [
        "missing.md: no such file", "a.md#nothing: no heading #nothing in a.md",
        "../../x.md: outside the repository",
        "mailto:a@b: only http(s) links may leave the repository"]


@pytest.mark.parametrize("doc", SELF_CONTAINED, ids=lambda p: str(p.relative_to(REPO)))
def test_user_docs_point_nowhere_outside_the_repository(doc):
    text = doc.read_text()
    for outside in ("../shared", "DESIGN.md", "/work/", ".library"):
        assert outside not in text, f"{doc.name} mentions {outside}"


def test_profile_examples_in_docs_load(tmp_path):
    text = (REPO / "docs" / "profiles.md").read_text()
    examples = re.findall(r"```toml\n(.*?)```", text, re.DOTALL)
    assert len(examples) >= 2
    for i, example in enumerate(examples):
        path = tmp_path / f"example{i}.toml"
        path.write_text(example)
        profile = load_profile(path)
        assert profile.name and profile.gpu.memory_bytes > 0 and profile.host.ram_bytes > 0


def test_docs_holds_only_user_docs():
    """Process history (the log, the measurements' history) lives in dev/, not beside the
    user docs; a new file in docs/ is a user doc, held to the rules above."""
    assert set((REPO / "docs").glob("*.md")) == {d for d in SELF_CONTAINED
                                                 if d.parent == REPO / "docs"}
