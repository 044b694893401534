"""MkDocs hooks (``mkdocs.yml``): the repository's Markdown outside docs/ joins the site.

The pages link the README, ARCHITECTURE.md and the folders' own READMEs with the relative paths
that work where the repository is browsed (``../configs/nmt/README.md`` from docs/). MkDocs
builds docs/ alone, so :func:`on_files` adds those files to the site (the README as its home
page, the others under ``repo/``), and :func:`on_page_markdown` rewrites every relative link by
where its target lies in the repository. A link to anything else outside docs/ is left as
written, so that ``mkdocs build --strict`` fails on it as on any broken link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# repository path -> path in the site's docs
INCLUDED = {
    "README.md": "index.md",
    "ARCHITECTURE.md": "repo/ARCHITECTURE.md",
    "configs/nmt/README.md": "repo/configs/nmt/README.md",
    "recurnmt/vision/README.md": "repo/recurnmt/vision/README.md",
    "data_prep/README.md": "repo/data_prep/README.md",
    "data_prep/embedded/lohelp_de_en/PROVENANCE.md": (
        "repo/data_prep/embedded/lohelp_de_en/PROVENANCE.md"
    ),
}
SOURCE = {site: repo for repo, site in INCLUDED.items()}  # site path -> repository path
# [text](target "title") and ![alt](target): group 2 is the target
LINK = re.compile(r'(\]\()([^)\s]+)((?:\s+"[^"]*")?\))')
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _docs(config: MkDocsConfig) -> str:
    """docs_dir relative to the repository's root (``docs``)."""
    return Path(config.docs_dir).resolve().relative_to(_root(config)).as_posix()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    for repo_path, site_path in INCLUDED.items():
        files.append(File.generated(config, site_path, abs_src_path=str(root / repo_path)))
    return files


def site_path(repo_path: str, docs: str) -> str | None:
    """Where a repository file lies in the site (None: not in it)."""
    if repo_path in INCLUDED:
        return INCLUDED[repo_path]
    if repo_path.startswith(f"{docs}/"):
        return repo_path[len(docs) + 1 :]
    return None


def rewrite_links(markdown: str, page_site_path: str, docs: str) -> str:
    """The page's relative links, from its place in the repository to its place in the site."""
    repo_dir = posixpath.dirname(SOURCE.get(page_site_path, f"{docs}/{page_site_path}"))
    site_dir = posixpath.dirname(page_site_path) or "."

    def fix(match: re.Match) -> str:
        target = match.group(2)
        if target.startswith(("#", "/")) or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):
            return match.group(0)
        path, sep, anchor = target.partition("#")
        site = site_path(posixpath.normpath(posixpath.join(repo_dir, path)), docs)
        if site is None:
            return match.group(0)  # outside the site: MkDocs reports it
        return f"{match.group(1)}{posixpath.relpath(site, site_dir)}{sep}{anchor}{match.group(3)}"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):  # code blocks stay as written
        parts += [LINK.sub(fix, markdown[last : fence.start()]), fence.group(0)]
        last = fence.end()
    return "".join([*parts, LINK.sub(fix, markdown[last:])])


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return rewrite_links(markdown, page.file.src_uri, _docs(config))
