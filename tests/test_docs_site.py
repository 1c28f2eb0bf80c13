"""The docs site (`make docs`, mkdocs.yml) stays complete without building it here: every docs/*.md page is in the
nav, and every module an API page documents (``::: relive.x``) exists in src/ (mkdocstrings reads them statically;
the build itself, with --strict, runs in CI)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = ROOT / "mkdocs.yml"


def test_every_docs_page_is_in_the_nav():
    config = MKDOCS.read_text()
    assert re.search(r"^strict: true$", config, re.M), "mkdocs.yml must build with strict: true"
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", config, re.M))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    pages |= {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs" / "api").glob("*.md")}
    assert pages - nav == set(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"mkdocs.yml's nav names missing pages: {sorted(nav - pages)}"


def test_api_pages_name_existing_modules():
    named = []
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for module in re.findall(r"^::: (\S+)$", page.read_text(), re.M):
            named.append(module)
            base = ROOT / "src" / Path(*module.split("."))
            assert base.with_suffix(".py").is_file() or (base / "__init__.py").is_file(), f"{page.name}: {module}"
    for public in ("relive.types", "relive.registry", "relive.replay", "relive.replay.samplers", "relive.agents",
                   "relive.data", "relive.train", "relive.experiments"):
        assert public in named, f"no API page documents {public}"
