"""The README and docs/ say only what the repository holds.

- Every repository path they name (in backticks, in code blocks, or as a relative link) exists;
  a link's ``#anchor`` names a heading of the file it points to.
- The README stays a newcomer's page (at most ~170 lines) and keeps the two commands, with the
  claim that ``.ci/run`` runs exactly the test command (checked against ``.ci/run`` itself).
- Every page under docs/ is linked from the README, so a newcomer can find it.
- The refusal the README and docs/api.md show is what ``kimik3 validate`` prints for that spec.
- The verbs the README says ``kimik3 --help`` lists are the ones it lists.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from kimik3.cli import main
from support.recipes import recipe

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = sorted([README, REPO / "recipes" / "README.md", REPO / "images" / "README.md",
                *(REPO / "docs").glob("*.md")])
README_MAX_LINES = 170
"""The issue asks for "about 150 lines"; this leaves room for a few more, not for a second manual."""

PATH_PREFIXES = ("operator/", "tools/", "recipes/", "docs/", "bench/", "charts/", "tests/", "images/",
                 "crds/", ".ci/")
"""Top-level folders of the repository: a word starting with one of these is a repository path."""

CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def _expand_braces(word: str) -> list[str]:
    """``a/{b,c}.py`` -> ``a/b.py``, ``a/c.py`` (one brace group, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    return [word[:m.start()] + alt + word[m.end():] for alt in m.group(1).split(",")]


def repo_paths(text: str) -> set[str]:
    """Repository paths named in ``text``: words of code spans and code blocks that start with a
    top-level folder, trailing punctuation removed, brace groups expanded; words holding a
    placeholder (``<registry>``) are skipped."""
    chunks = CODE_SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text)
    found: set[str] = set()
    for chunk in chunks:
        for word in chunk.split():
            word = word.strip("\"'(),;:")
            if word.startswith(PATH_PREFIXES) and "<" not in word:
                found.update(_expand_braces(word.rstrip(".")))
    return found


def _exists(path: str) -> bool:
    """A file, a folder, a glob that matches, or a module named without ``.py``."""
    if any(c in path for c in "*?["):
        return any(REPO.glob(path))
    target = REPO / path
    return target.exists() or target.with_name(target.name + ".py").exists()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def test_repo_paths_are_found_by_the_extractor() -> None:
    """The extractor is not vacuous: it finds spans, code-block words, braces and modules."""
    text = ("See `operator/kimik3/cli.py`, `bench/results/`, and\n```bash\ntools/test -k x\n```\n"
            "`operator/kimik3_dev/benchmark/{fleet,traces}.py` `docker -t <registry>/x` `D/sim/t.json`.")
    assert repo_paths(text) == {"operator/kimik3/cli.py", "bench/results/", "tools/test",
                                "operator/kimik3_dev/benchmark/fleet.py",
                                "operator/kimik3_dev/benchmark/traces.py"}
    assert _exists("operator/kimik3/cli") and not _exists("operator/kimik3/no_such_module")
    assert _slug("Refusals, with field paths") == "refusals-with-field-paths"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_path_exists(page: Path) -> None:
    missing = sorted(p for p in repo_paths(page.read_text()) if not _exists(p))
    assert missing == [], f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not this repository
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert broken == [], f"{page.relative_to(REPO)} has broken links: {broken}"


def test_readme_is_short_and_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "\ntools/kimik3 demo " in text  # the main job, at the start of a line of the code block
    assert "\ntools/test " in text
    assert ".ci/run calls exactly this" in text
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert ci == ["tools/test"], ".ci/run must run exactly the README's test command"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    unlinked = [p.name for p in sorted((REPO / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


def test_documented_refusal_is_what_validate_prints(tmp_path: Path) -> None:
    """The README's example (the GB300 recipe with TP6 and 9 draft tokens) and docs/api.md's copy
    of it match ``kimik3 validate`` line for line."""
    doc = recipe(topology={"tensorParallelSize": 6}, speculativeDecoding={"numSpeculativeTokens": 9})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["validate", "-f", str(path)])
    assert result.exit_code == 1
    printed = [line.strip() for line in result.output.strip().splitlines()]
    for page in (README, REPO / "docs" / "api.md"):
        blocks = [b for b in FENCE.findall(page.read_text()) if b.lstrip().startswith("k3-latency: ")]
        assert len(blocks) == 1, page
        assert [line.strip() for line in blocks[0].strip().splitlines()] == printed, page


def test_the_readme_lists_every_verb_of_kimik3_help() -> None:
    """The README's sentence "`kimik3 --help` lists ..." names each verb once, and no other (it left
    out `stage` and `wake`, 2026-12-05)."""
    sentence = " ".join(README.read_text().split()).partition("`kimik3 --help` lists ")[2].partition(".")[0]
    listed = CODE_SPAN.findall(sentence)
    assert sorted(listed) == main.list_commands(click.Context(main)), sentence
