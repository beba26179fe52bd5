"""6.1: the incremental file parser, a pure state machine over whole lines."""

from __future__ import annotations

import codecs
from typing import Any

from sfu_sidecar.captions.webvtt.model import (
    ARROW,
    ASCII_WS,
    SIGNATURE,
    Block,
    InvalidWebVTT,
    ParseResult,
    Region,
    Style,
    VttCue,
)
from sfu_sidecar.captions.webvtt.timings import parse_region_settings, parse_timings_and_settings


class _BlockState:
    """Variables of 6.1 "collect a WebVTT block" between lines."""

    __slots__ = ("buffer", "cue", "in_header", "line_count", "region", "seen_arrow", "style")

    def __init__(self, in_header: bool) -> None:
        self.in_header = in_header
        self.line_count = 0
        self.buffer = ""
        self.seen_arrow = False
        self.cue: tuple[float, float, dict[str, Any], str] | None = None
        self.style = False
        self.region = False


_SIGNATURE, _AFTER_SIGNATURE, _BETWEEN, _IN_BLOCK, _DONE = range(5)
_CONTINUE, _REPROCESS, _END = range(3)


class WebVTTParser:
    """Incremental WebVTT parser (6.1). Feed bytes or text; get completed blocks back.

    Raises :class:`InvalidWebVTT` as soon as the signature is known to be wrong.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
        self._started = False
        self._skip_lf = False
        self._partial = ""
        self._state = _SIGNATURE
        self._block: _BlockState | None = None
        self._seen_cue = False
        self.regions: list[Region] = []
        self.header: list[str] = []
        self.signature_line = ""

    def feed(self, data: bytes | str) -> list[Block]:
        """Add input; return the blocks it completed, in file order."""
        if isinstance(data, bytes):
            return self._feed_text(self._decoder.decode(data), decoded=True)
        return self._feed_text(data, decoded=False)

    def close(self) -> list[Block]:
        """End of input: finish the last line and block; raise if the signature never came."""
        out = self._feed_text(self._decoder.decode(b"", final=True), decoded=True)
        if self._state == _DONE:
            return out
        line, self._partial = self._partial, ""
        out.extend(self._line(line, eof=True))
        self._state = _DONE
        return out

    # Text preprocessing of 6.1 step 1, carried across chunk boundaries.
    def _feed_text(self, text: str, *, decoded: bool) -> list[Block]:
        if self._state == _DONE and (text or not decoded):
            raise ValueError("feed() after close()")
        if not text:
            return []
        if not self._started:
            self._started = True
            if not decoded:
                # Text input skipped the UTF-8 decode that drops one leading BOM; drop it here.
                text = text.removeprefix("\ufeff")
                if not text:
                    return []
        if self._skip_lf and text[0] == "\n":
            text = text[1:]  # the LF of a CRLF split across chunks
        if not text:
            return []
        self._skip_lf = text[-1] == "\r"
        text = text.replace("\x00", "\ufffd").replace("\r\n", "\n").replace("\r", "\n")
        out: list[Block] = []
        pieces = (self._partial + text).split("\n")
        self._partial = pieces.pop()
        for line in pieces:
            out.extend(self._line(line, eof=False))
        if self._state == _SIGNATURE:
            self._check_signature(self._partial, terminated=False)
        return out

    def _check_signature(self, line: str, *, terminated: bool) -> None:
        # 6.1 steps 4-6, decided as early as the characters seen allow (live ingest rejects a
        # wrong stream at its first bytes).
        if len(line) >= 6 and not line.startswith(SIGNATURE):
            raise InvalidWebVTT(f"file does not start with {SIGNATURE!r}")
        if len(line) >= 7 and line[6] not in " \t":
            raise InvalidWebVTT(
                f"{SIGNATURE!r} must be followed by a space, a tab or a line break"
            )
        if terminated and len(line) < 6:
            raise InvalidWebVTT(f"file does not start with {SIGNATURE!r}")

    def _line(self, line: str, *, eof: bool) -> list[Block]:
        if self._state == _SIGNATURE:
            self._check_signature(line, terminated=True)
            self.signature_line = line
            self._state = _DONE if eof else _AFTER_SIGNATURE
            return []
        if self._state == _AFTER_SIGNATURE:
            # Step 11: a blank line right after the signature means no header block.
            self._state = _BETWEEN
            if line == "":
                return []
            self._block = _BlockState(in_header=True)
            self._state = _IN_BLOCK
        out: list[Block] = []
        while True:
            if self._state == _BETWEEN:
                if line == "":
                    return out  # step 14.5: LFs between blocks
                self._block = _BlockState(in_header=False)
                self._state = _IN_BLOCK
            block = self._block
            assert block is not None
            action = self._block_line(block, line)
            if action == _REPROCESS:
                # "let position be previous position and break": the line starts a new block.
                self._finish_block(block, out)
                continue
            if action == _END or eof:  # an empty line or the end of input ends the block
                self._finish_block(block, out)
            return out

    def _block_line(self, block: _BlockState, line: str) -> int:
        """One iteration of 6.1 "collect a WebVTT block" step 11."""
        block.line_count += 1
        if ARROW in line:
            if not block.in_header and (
                block.line_count == 1 or (block.line_count == 2 and not block.seen_arrow)
            ):
                block.seen_arrow = True
                parsed = parse_timings_and_settings(line, self.regions)
                if parsed is None:
                    block.cue = None
                else:
                    start, end, settings = parsed
                    block.cue = (start, end, settings, block.buffer)
                    block.buffer = ""
                    self._seen_cue = True
                return _CONTINUE
            return _REPROCESS
        if line == "":
            return _END
        if not block.in_header and block.line_count == 2 and not self._seen_cue:
            # Step 11.6.1: "STYLE" / "REGION" alone on the first line (trailing whitespace
            # allowed) makes the block a style sheet or a region, before any cue only.
            for keyword in ("STYLE", "REGION"):
                rest = block.buffer.removeprefix(keyword)
                if rest != block.buffer and all(c in ASCII_WS for c in rest):
                    block.style = keyword == "STYLE"
                    block.region = keyword == "REGION"
                    block.buffer = ""
                    break
        if block.buffer:
            block.buffer += "\n"
        block.buffer += line
        return _CONTINUE

    def _finish_block(self, block: _BlockState, out: list[Block]) -> None:
        self._block = None
        self._state = _BETWEEN
        if block.in_header:
            self.header.extend(block.buffer.split("\n") if block.buffer else [])
            return
        if block.cue is not None:
            start, end, settings, cue_id = block.cue
            out.append(VttCue(cue_id, start, end, block.buffer, **settings))
        elif block.style:
            out.append(Style(block.buffer))
        elif block.region:
            region = parse_region_settings(block.buffer)
            self.regions.append(region)
            out.append(region)


def parse(data: bytes | str) -> ParseResult:
    """Parse a whole file. Raises :class:`InvalidWebVTT` on a bad signature."""
    parser = WebVTTParser()
    result = ParseResult()
    result.add(parser.feed(data))
    result.add(parser.close())
    return result
