"""The documentation: the README is a short first read that starts with the two commands, its
pages under docs/ build with MkDocs without a warning, and every relative link resolves
(issue 27, item 7)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FIRST_LINES = """\
# recurnmt

```bash
make demo   # fresh machine: builds .venv, prepares the embedded de-en corpus, trains a small
            # RingFormer with fairseq-train on the CPU, translates the test set, prints sacreBLEU
make test   # ruff + the whole test suite (builds .venv first when it is missing)
```
"""
# the repository's Markdown outside docs/ that the site includes (docs/hooks.py)
INCLUDED = (
    "ARCHITECTURE.md",
    "configs/nmt/README.md",
    "recurnmt/vision/README.md",
    "data_prep/README.md",
    "data_prep/embedded/lohelp_de_en/PROVENANCE.md",
)
LINK = re.compile(r'\]\(([^)\s]+)(?:\s+"[^"]*")?\)')
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)


def prose(path: Path) -> str:
    """The file's Markdown without its code blocks."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and MkDocs' toc both make it (for headings without runs of
    punctuation between words)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return re.sub(r"\s+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose(path), re.M)}


def markdown_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), *(REPO / p for p in INCLUDED)]


def nav_pages() -> list[str]:
    """The docs-relative paths that mkdocs.yml's nav names."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    config = yaml.load(text, Loader=yaml.BaseLoader)  # no custom tags in it

    def walk(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in walk(item)]
        return [p for value in node.values() for p in walk(value)]

    return walk(config["nav"])


def test_the_readme_starts_with_the_two_commands():
    assert README.read_text(encoding="utf-8").startswith(FIRST_LINES)


def test_the_readme_is_a_short_first_read_with_a_map_to_every_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    assert "| family | what is shared | paper | `--arch` (fairseq) |" in text  # the families
    linked = set(LINK.findall(prose(README)))
    pages = [p for p in nav_pages() if (REPO / "docs" / p).is_file()]
    missing = [p for p in pages if f"docs/{p}" not in linked]
    assert not missing, f"the README's map lacks {missing}"


def test_every_docs_page_is_in_the_nav():
    tracked = subprocess.run(
        ["git", "ls-files", "docs/*.md"], cwd=REPO, capture_output=True, text=True
    )
    if tracked.returncode:
        pytest.skip(f"not a git checkout: {tracked.stderr.strip()}")
    pages = {Path(p).relative_to("docs").as_posix() for p in tracked.stdout.split()}
    assert pages, "no page found"
    assert not pages - set(nav_pages()), "pages missing from mkdocs.yml's nav"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    """Files and folders exist, and anchors name a heading of the page linked (or this one)."""
    broken = []
    for target in LINK.findall(prose(path)):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)}: {broken}"


def test_the_link_check_sees_what_it_checks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "# A page (`make x`)\n\n[a](page.md#a-page-make-x) [b](#nope) [c](gone.md)\n"
        "```\n[d](in-a-code-block.md)\n```\n"
    )
    assert anchors(page) == {"a-page-make-x"}
    assert LINK.findall(prose(page)) == ["page.md#a-page-make-x", "#nope", "gone.md"]


def test_the_site_folder_is_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "-q", "site/"], cwd=REPO)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, "site/ (mkdocs build's output) is not git-ignored"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (it is in the dev extra: make setup installs it)",
)
def test_mkdocs_builds_the_site_strictly(tmp_path):
    """``mkdocs build --strict``: any warning (a broken link or anchor, a nav entry without a
    page) fails the build."""
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (site / "index.html").exists() and (site / "install" / "index.html").exists()
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="install/"' in home  # the README's docs/install.md, as the site's page
