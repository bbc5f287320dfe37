"""An incremental, strict JSON reader for one value, as text streams in.

Tool-call arguments are streamed the way llama-server sends them: compact JSON (nlohmann's `dump()`: no
spaces, UTF-8 kept), each fragment a prefix of the final text. The reader turns the model's JSON,
whatever its spacing, into those canonical pieces as soon as they are certain: structure at once, string
characters as they arrive (an escape waits for its last character), numbers and literals when they end.
Every piece carries the path of the value it belongs to, so a caller can route the members of a call
object (`name`, `arguments`, `id`) to different places. A syntax error raises at the first bad character.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum

Path = tuple[str | int, ...]

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]+')
_WHITESPACE = " \t\n\r"


class JsonSyntaxError(ValueError):
    def __init__(self, message: str, consumed: int) -> None:
        super().__init__(message)
        self.consumed = consumed  # characters of the failing feed() accepted before the error


class Kind(Enum):
    OPEN = "open"  # `{` or `[` of the value at path
    CLOSE = "close"
    COMMA = "comma"  # between members/elements of the container at path
    KEY = "key"  # `"k":` in the object at path; the member's value has path + (k,)
    STRING_OPEN = "string_open"  # `"` of a string value
    STRING = "string"  # escaped characters; `raw` has them decoded
    STRING_CLOSE = "string_close"
    SCALAR = "scalar"  # a number, true, false or null


@dataclass(frozen=True)
class Piece:
    path: Path
    kind: Kind
    text: str  # canonical JSON text
    raw: str = ""  # decoded characters (STRING) or the key (KEY)


@dataclass
class _Frame:
    path: Path
    is_object: bool
    count: int = 0
    expect: str = "first"  # first (key/value or close), item (key/value), colon, value, next (comma/close)
    key: str = ""


class JsonReader:
    """Reads one JSON value; `feed` returns how much of the text belonged to it (the rest is the caller's)."""

    def __init__(self) -> None:
        self.done = False
        self.pieces: list[Piece] = []  # produced since the last take()
        self._stack: list[_Frame] = []
        self._token = ""  # a number or literal in progress
        self._string: _StringLexer | None = None
        self._string_is_key = False

    def take(self) -> list[Piece]:
        pieces, self.pieces = self.pieces, []
        return pieces

    def feed(self, text: str) -> int:
        i = 0
        while i < len(text) and not self.done:
            try:
                i = self._step(text, i)
            except JsonSyntaxError as e:
                raise JsonSyntaxError(str(e), i) from None
        return i

    def finish(self) -> None:
        """The text ended: a top-level number ends here; anything else unfinished is an error."""
        if self._token and not self._stack and _LITERALS.get(self._token[0]) is None:
            self._end_token()
        if not self.done:
            raise JsonSyntaxError("unexpected end of JSON", 0)

    # -- one step: a run of string characters, or one character -----------------------------------

    def _step(self, text: str, i: int) -> int:
        if self._string is not None:
            return self._string_step(text, i)
        char = text[i]
        if self._token:
            if self._token_continues(char):
                self._token += char
                self._check_literal()
                return i + 1
            self._end_token()
            return i  # the terminator is read again in the new state
        if char in _WHITESPACE:
            return i + 1
        self._structural(char)
        return i + 1

    def _structural(self, char: str) -> None:
        frame = self._stack[-1] if self._stack else None
        if frame is None or frame.expect in ("first", "item", "value"):
            if frame is not None and frame.is_object and frame.expect != "value":
                self._object_key_or_close(frame, char)
            elif char == "]" and frame is not None and frame.expect == "first":
                self._close(frame)
            else:
                self._value_start(char)
        elif frame.expect == "colon":
            if char != ":":
                raise JsonSyntaxError(f"expected ':' after a key, got {char!r}", 0)
            frame.expect = "value"
        else:  # next
            self._after_member(frame, char)

    def _object_key_or_close(self, frame: _Frame, char: str) -> None:
        if char == "}" and frame.expect == "first":
            self._close(frame)
        elif char == '"':
            self._string, self._string_is_key = _StringLexer(), True
        else:
            raise JsonSyntaxError(f"expected a key, got {char!r}", 0)

    def _after_member(self, frame: _Frame, char: str) -> None:
        if char == ",":
            frame.expect = "item"
            self.pieces.append(Piece(frame.path, Kind.COMMA, ","))
        elif char == ("}" if frame.is_object else "]"):
            self._close(frame)
        else:
            raise JsonSyntaxError(f"expected ',' or the end of the container, got {char!r}", 0)

    def _value_start(self, char: str) -> None:
        path = self._value_path()
        if char in "{[":
            self._stack.append(_Frame(path, char == "{"))
            self.pieces.append(Piece(path, Kind.OPEN, char))
        elif char == '"':
            self._string, self._string_is_key = _StringLexer(), False
            self.pieces.append(Piece(path, Kind.STRING_OPEN, '"'))
        elif char in _LITERALS or char == "-" or char.isdigit():
            self._token = char
        else:
            raise JsonSyntaxError(f"expected a JSON value, got {char!r}", 0)

    def _value_path(self) -> Path:
        if not self._stack:
            return ()
        frame = self._stack[-1]
        return (*frame.path, frame.key if frame.is_object else frame.count)

    def _close(self, frame: _Frame) -> None:
        self._stack.pop()
        self.pieces.append(Piece(frame.path, Kind.CLOSE, "}" if frame.is_object else "]"))
        self._value_done()

    def _value_done(self) -> None:
        if not self._stack:
            self.done = True
            return
        frame = self._stack[-1]
        frame.count += 1
        frame.expect = "next"

    # -- numbers and literals -----------------------------------------------------------------------

    def _token_continues(self, char: str) -> bool:
        literal = _LITERALS.get(self._token[0])
        if literal is not None:
            return len(self._token) < len(literal)
        return char in _NUMBER_CHARS

    def _check_literal(self) -> None:
        literal = _LITERALS.get(self._token[0])
        if literal is None:
            return
        if not literal.startswith(self._token):
            raise JsonSyntaxError(f"invalid literal {self._token!r}", 0)
        if self._token == literal:
            self._end_token()

    def _end_token(self) -> None:
        token, self._token = self._token, ""
        if token in _LITERALS.values():
            canonical = token
        elif _NUMBER.fullmatch(token):
            canonical = json.dumps(json.loads(token))
        else:
            raise JsonSyntaxError(f"invalid number {token!r}", 0)
        self.pieces.append(Piece(self._value_path(), Kind.SCALAR, canonical))
        self._value_done()

    # -- strings ------------------------------------------------------------------------------------

    def _string_step(self, text: str, i: int) -> int:
        assert self._string is not None
        i, decoded, closed = self._string.read(text, i)
        if self._string_is_key:
            if closed:
                self._end_key(self._string.key)
            return i
        path = self._value_path()
        if decoded:
            self.pieces.append(Piece(path, Kind.STRING, _escape(decoded), decoded))
        if closed:
            self._string = None
            self.pieces.append(Piece(path, Kind.STRING_CLOSE, '"'))
            self._value_done()
        return i

    def _end_key(self, key: str) -> None:
        self._string = None
        frame = self._stack[-1]
        frame.key, frame.expect = key, "colon"
        self.pieces.append(Piece(frame.path, Kind.KEY, _escape_string(key) + ":", key))


class _StringLexer:
    """The inside of one string: decodes escapes (pairing \\u surrogates), holds an unfinished one."""

    def __init__(self) -> None:
        self.key = ""  # everything decoded, kept for keys
        self._escape = ""  # an escape sequence in progress, from its backslash
        self._high = ""  # a decoded high surrogate waiting for its low half

    def read(self, text: str, i: int) -> tuple[int, str, bool]:
        """(new index, characters decoded, whether the string closed)."""
        out: list[str] = []
        while i < len(text):
            if self._escape:
                i = self._read_escape(text, i, out)
                continue
            char = text[i]
            if char == '"':
                self._flush_high(out)
                return self._done(i + 1, out, True)
            if char == "\\":
                self._escape = "\\"
                i += 1
                continue
            run = _PLAIN_RUN.match(text, i)
            if run is None:
                raise JsonSyntaxError("control character in a string", 0)
            self._flush_high(out)
            out.append(run.group())
            i = run.end()
        return self._done(i, out, False)

    def _done(self, i: int, out: list[str], closed: bool) -> tuple[int, str, bool]:
        decoded = "".join(out)
        self.key += decoded
        return i, decoded, closed

    def _read_escape(self, text: str, i: int, out: list[str]) -> int:
        self._escape += text[i]
        if len(self._escape) == 2:
            kind = self._escape[1]
            if kind == "u":
                return i + 1
            if kind not in _ESCAPES:
                raise JsonSyntaxError(f"invalid escape {self._escape!r}", 0)
            self._flush_high(out)
            out.append(_ESCAPES[kind])
            self._escape = ""
        elif len(self._escape) == 6:
            self._unicode_escape(out)
        elif text[i] not in "0123456789abcdefABCDEF":
            raise JsonSyntaxError(f"invalid escape {self._escape!r}", 0)
        return i + 1

    def _unicode_escape(self, out: list[str]) -> None:
        code = int(self._escape[2:], 16)
        self._escape = ""
        if 0xDC00 <= code <= 0xDFFF and self._high:
            pair = (ord(self._high) - 0xD800) * 0x400 + (code - 0xDC00) + 0x10000
            self._high = ""
            out.append(chr(pair))
            return
        self._flush_high(out)
        if 0xD800 <= code <= 0xDBFF:
            self._high = chr(code)
        else:
            out.append(chr(code))

    def _flush_high(self, out: list[str]) -> None:
        if self._high:
            out.append(self._high)
            self._high = ""


def _escape(decoded: str) -> str:
    """The canonical inside of a JSON string: nlohmann's escaping (and Python's, ensure_ascii off)."""
    return json.dumps(decoded, ensure_ascii=False)[1:-1]


def _escape_string(decoded: str) -> str:
    return json.dumps(decoded, ensure_ascii=False)


def canonical(text: str) -> str:
    """llama-server's compact form of a complete JSON text (what a finished stream adds up to)."""
    return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
