"""The README and the docs: a README that fits on a page, current figures, and links that lead somewhere.

README.md stays under 15,000 bytes; docs/figures.md and the README's figures table are what scripts/figures
writes from docs/figures.json, and every number of that table is on the figures page; every relative link in
README.md and docs/*.md names a file that exists and, with an #anchor, a heading of it (GitHub's slugs).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FIGURES = ROOT / "scripts" / "figures"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# The pages this issue wrote, which link nowhere outside the repository.
OWN_PAGES = [README] + [ROOT / "docs" / name for name in
                        ("index.md", "variables.md", "architecture.md", "upgrades.md", "figures.md")]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> str:
    """The text without its fenced code blocks (a link in code is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped but for '-' and '_', spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in a Markdown page (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The link targets of a page, outside code."""
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


def run_figures(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FIGURES), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def readme_figures_table() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("<!-- figures:begin -->", 1)[1].split("<!-- figures:end -->", 1)[0]


def test_readme_fits_on_a_page():
    size = len(README.read_bytes())
    assert size < 15_000, f"README.md is {size} bytes: move detail into docs/ (docs/index.md lists the pages)"


def test_readme_starts_with_the_two_commands():
    commands = [line.split("#")[0].strip() for line in README.read_text(encoding="utf-8").splitlines()
                if line.startswith("make ")]
    assert commands[:2] == ["make demo", "make test"], "make demo and make test are the README's first commands"


def test_readme_states_the_ansible_range_of_meta_runtime():
    runtime = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text(encoding="utf-8"))
    assert f"`{runtime['requires_ansible']}`" in README.read_text(encoding="utf-8"), \
        "the README's requirements name meta/runtime.yml's requires_ansible"


def test_the_figures_pages_are_current():
    result = run_figures("--check")
    assert result.returncode == 0, result.stderr + "run scripts/figures and commit what it writes"


def test_every_figure_says_when_where_and_how():
    data = json.loads((ROOT / "docs" / "figures.json").read_text(encoding="utf-8"))
    for figure in data["figures"]:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", figure["measured"]), figure["name"]
        assert figure.get("run") or figure.get("commit"), figure["name"]
        assert figure["source"] and figure["page"], figure["name"]
        assert not figure["ratio"] or figure["anchor"], f"{figure['name']}: a ratio needs what it is a ratio to"
    assert any(figure.get("readme") for figure in data["figures"])


def test_check_fails_with_a_message_when_a_page_is_stale(tmp_path):
    """--check against a copy of the pages in which the README's table was edited by hand."""
    copy = tmp_path / "repo"
    (copy / "docs").mkdir(parents=True)
    (copy / "scripts").mkdir()
    for name in ("docs/figures.json", "docs/figures.md", "README.md", "scripts/figures"):
        (copy / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    readme = copy / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("| 2026-11-2", "| 2025-11-2", 1), encoding="utf-8")
    result = subprocess.run([sys.executable, str(copy / "scripts" / "figures"), "--check"], capture_output=True,
                            text=True, cwd=copy, timeout=60)
    assert result.returncode == 1
    assert "README.md" in result.stderr and "scripts/figures" in result.stderr
    assert subprocess.run([sys.executable, str(copy / "scripts" / "figures")], capture_output=True,
                          cwd=copy, timeout=60).returncode == 0
    assert readme.read_text(encoding="utf-8") == README.read_text(encoding="utf-8")


def test_every_number_of_the_readme_figures_table_is_on_the_figures_page():
    page = (ROOT / "docs" / "figures.md").read_text(encoding="utf-8")
    numbers = re.findall(r"\d+(?:[.,]\d+)*", readme_figures_table().split("\n\n")[0])
    assert numbers
    missing = sorted({number for number in numbers if number not in page})
    assert not missing, f"numbers in the README's figures table that docs/figures.md lacks: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", OWN_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_user_pages_link_nowhere_outside(page):
    outside = [target for target in links(page) if re.match(r"^[a-z][a-z0-9+.-]*:", target)]
    assert not outside, f"{page.relative_to(ROOT)} links outside the repository: {outside}"


def test_slugs_follow_github():
    assert slug("Upgrades: `playbooks/upgrade.yml`") == "upgrades-playbooksupgradeyml"
    assert slug("What `gms_insecure: true` exposes") == "what-gms_insecure-true-exposes"
    assert slug("The agent's decisions in the journal") == "the-agents-decisions-in-the-journal"
    assert slug("Runs P-R (the measurement mended)") == "runs-p-r-the-measurement-mended"
