"""The documentation holds together: README.md stays a short introduction, it links to every
page of the manual in docs/, and every relative link in README.md, docs/ and bench/README.md
leads to a file of the repository and, where it names a #fragment, to a heading of that file
(GitHub's anchors: the heading's text lowercased, punctuation but ``-`` and ``_`` dropped,
spaces made ``-``, a repeated heading numbered ``-1``, ``-2``, ...)."""

from __future__ import annotations

import difflib
import re
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250
# Every Markdown file whose links are checked.
CHECKED = [README, *sorted(DOCS.glob("*.md")), ROOT / "bench" / "README.md"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
# [text](target) or ![alt](target), the target optionally in <...> and followed by a "title".
_INLINE_LINK = re.compile(
    r"!?\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\(\s*(?:<(?P<angled>[^>]*)>|(?P<bare>[^()\s]*(?:\([^()\s]*\)[^()\s]*)*))"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[(?P<text>[^\]]+)\]:\s*<?(?P<target>[^\s>]+)>?",
                                   re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    source: Path
    line: int
    text: str
    target: str

    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}: [{self.text}]({self.target})"


def _blank(match: re.Match[str]) -> str:
    """The matched text with every character but line breaks replaced, so offsets stay."""
    return re.sub(r"[^\n]", "x", match.group(0))


def _prose(text: str) -> str:
    """``text`` with fenced code blocks and code spans blanked: what is left can hold links,
    at the same offsets."""
    lines = text.split("\n")
    fence: str | None = None
    for i, line in enumerate(lines):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * len(opened.group(1))
            lines[i] = " " * len(line)
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            lines[i] = " " * len(line)
    return _CODE_SPAN.sub(_blank, "\n".join(lines))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before numbering repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML goes
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The fragment of every heading in the Markdown file ``path``, and of every explicit
    ``<a name=...>`` or ``id=...``."""
    raw = path.read_text()
    found: set[str] = set()
    seen: Counter[str] = Counter()
    fence: str | None = None
    for line in raw.split("\n"):
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)[0] * len(opened.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        heading = _HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    found.update(re.findall(r"""<a\s[^>]*(?:name|id)=["']([^"']+)["']""", raw))
    return found


def links(path: Path) -> list[Link]:
    """Every link in the Markdown file ``path`` that is not inside code."""
    raw = path.read_text()
    text = _prose(raw)  # the same offsets as raw, code blanked
    out = []
    for match in _INLINE_LINK.finditer(text):
        target = match.group("angled") if match.group("angled") is not None else match.group("bare")
        line = text.count("\n", 0, match.start()) + 1
        out.append(Link(path, line, raw[match.start("text"):match.end("text")], target))
    for match in _REFERENCE_DEFINITION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        out.append(Link(path, line, raw[match.start("text"):match.end("text")],
                        match.group("target")))
    return out


def relative(link: Link) -> bool:
    return not _SCHEME.match(link.target) and not link.target.startswith("//")


def resolve(link: Link) -> tuple[Path, str]:
    """The file a relative link leads to and its fragment ('' when none)."""
    path_part, _, fragment = link.target.partition("#")
    path_part = urllib.parse.unquote(path_part)
    target = (link.source.parent / path_part).resolve() if path_part else link.source
    return target, urllib.parse.unquote(fragment)


def broken(link: Link) -> str | None:
    """Why a relative link leads nowhere, or None when it is good."""
    if not link.target:
        return "empty target"
    target, fragment = resolve(link)
    if not target.is_relative_to(ROOT):
        return f"{target} is outside the repository"
    if not target.exists():
        return f"no such file: {target.relative_to(ROOT)}"
    if fragment:
        if target.is_dir() or target.suffix.lower() != ".md":
            return f"#{fragment} on {target.relative_to(ROOT)}, which is not a Markdown file"
        known = anchors(target)
        if fragment not in known:
            near = difflib.get_close_matches(fragment, sorted(known), n=3)
            hint = f" (did you mean {', '.join('#' + n for n in near)}?)" if near else ""
            return f"no heading #{fragment} in {target.relative_to(ROOT)}{hint}"
    return None


def test_slug_follows_github() -> None:
    assert slug("Live segments (`bench/segments.py`)") == "live-segments-benchsegmentspy"
    assert slug("MSE playback latency (`bench/mse_latency.py`)") == (
        "mse-playback-latency-benchmse_latencypy")
    assert slug("Cascade: origins, edges and the stream directory") == (
        "cascade-origins-edges-and-the-stream-directory")
    assert slug("What an attacker can do, and what stops it") == (
        "what-an-attacker-can-do-and-what-stops-it")


def test_readme_is_short() -> None:
    count = len(README.read_text().splitlines())
    assert count <= README_MAX_LINES, (
        f"README.md has {count} lines, more than {README_MAX_LINES}: it is the introduction; "
        "move the details into a page of docs/ and link to it")


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert path.exists(), f"{path.relative_to(ROOT)} is gone: update CHECKED in {__file__}"
    problems = [f"{link.where()}: {why}" for link in links(path) if relative(link)
                for why in [broken(link)] if why is not None]
    assert not problems, "broken links:\n  " + "\n  ".join(problems)


def test_readme_links_every_page_of_the_manual() -> None:
    linked = {resolve(link)[0] for link in links(README) if relative(link)}
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.glob("*.md"))
               if p.resolve() not in linked]
    assert not missing, f"README.md does not link to {', '.join(missing)}"
