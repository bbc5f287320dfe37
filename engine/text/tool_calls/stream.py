"""The streaming machinery the formats are built from: a driver over a text buffer and a few states.

A format's parser is a small state machine. Each state looks at the buffered text and either consumes
some of it (emitting content, reasoning or call deltas) or waits for more; like the reasoning splitter,
it holds back only what may still be part of a marker. The driver runs states until none can progress,
and hands out what was emitted as one ParseDelta.

Calls are tentative: what a marker starts is buffered, and if the text after it turns out not to be a
call (a marker followed by broken JSON), the marker and everything after it are content, as llama-server's
parser falls back to content. When a call stops being tentative depends on `stream_arguments`:

- True (streaming, llama-server's partial parses): once its name is known (for formats that put the name
  in a header, once its JSON arguments have begun), and its arguments then stream as they come. An
  announced call cannot be taken back: if its arguments break off (the output was cut, or the JSON went
  wrong after that point) it keeps the arguments streamed so far and the rest of the text is content.
- False (llama-server's final parse): everything from the first marker waits for the end of the output,
  and if any call there is broken, all of it is content. Calls come whole, at the flush.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import regex

from engine.text.reasoning import partial_suffix
from engine.text.tool_calls.common import (
    READ_ALL,
    AnswerReading,
    IdFactory,
    ParseDelta,
    ToolCallDelta,
    ToolCallFormat,
    ToolCallParser,
)
from engine.text.tool_calls.fenced import FencedJson
from engine.text.tool_calls.json_stream import JsonReader, JsonSyntaxError, Kind, Path, Piece


class ParseFailure(Exception):
    """The text is not what the format expects here."""


@dataclass
class _Step:
    """One call's output within one delta (fragments joined at the end: arguments come in many pieces)."""

    index: int
    id: str | None = None
    name: str | None = None
    fragments: list[str] = field(default_factory=list)

    def delta(self) -> ToolCallDelta:
        return ToolCallDelta(self.index, self.id, self.name, "".join(self.fragments))


class Emitter:
    """Collects one ParseDelta's worth of output. Without `calls` (a request that asked for none) a
    call's start fails the parse, so its markup is content."""

    def __init__(self, new_id: IdFactory, next_index: int = 0, calls: bool = True) -> None:
        self.new_id = new_id
        self.next_index = next_index  # the index the next call gets
        self.calls = calls
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._steps: list[_Step] = []

    def content(self, text: str) -> None:
        if text:
            self._content.append(text)

    def reasoning(self, text: str) -> None:
        if text:
            self._reasoning.append(text)

    def open_call(self, name: str, call_id: str | None = None) -> None:
        if not self.calls:
            raise ParseFailure("a call in an answer that may hold none")
        self._steps.append(_Step(self.next_index, call_id or self.new_id(), name))
        self.next_index += 1

    def name_id(self, index: int, call_id: str) -> None:
        """The model's id for call `index`, written after its name: taken while the call's opening is
        still here (a final parse keeps a call until the end); a stream has sent its id already."""
        for step in self._steps:
            if step.index == index and step.id is not None:
                step.id = call_id

    def arguments(self, text: str) -> None:
        if not text:
            return
        if not self._steps or self._steps[-1].index != self.next_index - 1:
            self._steps.append(_Step(self.next_index - 1))
        self._steps[-1].fragments.append(text)

    def absorb(self, other: Emitter) -> None:
        self._content += other._content
        self._reasoning += other._reasoning
        for step in other._steps:
            if step.id is None:
                self.arguments("".join(step.fragments))
            else:
                self._steps.append(step)
        self.next_index = other.next_index

    def take(self) -> ParseDelta:
        calls = tuple(step.delta() for step in self._steps)
        delta = ParseDelta("".join(self._content), "".join(self._reasoning), calls)
        self._content, self._reasoning, self._steps = [], [], []
        return delta


class State:
    def step(self, d: Driver) -> bool:
        """Consume and emit what is certain; False when nothing can happen until more text comes."""
        raise NotImplementedError


Next = Callable[[], State]


class Driver:
    """A ToolCallParser: runs a format's states over the pushed text."""

    def __init__(
        self,
        start: State,
        new_id: IdFactory,
        stream_arguments: bool = True,
        reading: AnswerReading = READ_ALL,
    ) -> None:
        self.buf = ""
        self.final = False
        self.state = start
        self.reading = reading
        self._stream_arguments = stream_arguments
        self._out = Emitter(new_id, calls=reading.calls)
        self._pending: Emitter | None = None  # a tentative call's output
        self._pending_raw = ""  # the text it came from, given back as content if it fails
        self._incomplete = False  # the tentative stretch has not reached its commit point
        self._stretch_start = 0  # where the current stretch's text starts in _pending_raw

    @property
    def streaming(self) -> bool:
        """Calls go out as they are read (else whole, at the end: llama-server's final parse)."""
        return self._stream_arguments

    @property
    def emit(self) -> Emitter:
        return self._pending if self._pending is not None else self._out

    def push(self, text: str) -> ParseDelta:
        self.buf += text
        self._run()
        return self._out.take()

    def flush(self) -> ParseDelta:
        self.final = True
        self._run()
        return self._out.take()

    def consume(self, n: int) -> str:
        taken, self.buf = self.buf[:n], self.buf[n:]
        if self._pending is not None:
            self._pending_raw += taken
        return taken

    def begin_tentative(self) -> None:
        self._incomplete = True
        if self._pending is None:
            self._pending = Emitter(self._out.new_id, self._out.next_index, self._out.calls)
            self._pending_raw = ""
        self._stretch_start = len(self._pending_raw)

    def give_back(self) -> None:
        """The marker was a false alarm (what follows it is no call's start): its text is content and
        the parse goes on. Only before the stretch emitted anything."""
        assert self._pending is not None
        raw = self._pending_raw[self._stretch_start :]
        self._incomplete = False
        if self._stream_arguments:  # the pending output is this stretch's alone, and empty
            self._pending, self._pending_raw = None, ""
            self._out.content(raw)
        else:
            self._pending.content(raw)

    def commit(self) -> None:
        """The tentative stretch is sound so far (without stream_arguments: it waits for the end)."""
        self._incomplete = False
        if self._pending is not None and self._stream_arguments:
            self._release()

    def _release(self) -> None:
        if self._pending is not None:
            self._out.absorb(self._pending)
            self._pending, self._pending_raw = None, ""

    def _run(self) -> None:
        while True:
            try:
                if not self.state.step(self):
                    break
            except ParseFailure:
                self._fail()
        if self.final and (self.buf or self._incomplete):
            self._fail()  # the text ended where the format needed more
        if self.final:
            self._release()

    def _fail(self) -> None:
        """The rest of the output is content; a tentative call gives its text back first."""
        if self._pending is not None:
            self._out.content(self._pending_raw)
            self._pending, self._pending_raw = None, ""
        self._incomplete = False
        self._out.content(self.consume(len(self.buf)))
        self.state = RestIsContent()


# -- states -------------------------------------------------------------------------------------------


class RestIsContent(State):
    def step(self, d: Driver) -> bool:
        if not d.buf:
            return False
        d.emit.content(d.consume(len(d.buf)))
        return True


@dataclass(frozen=True)
class Marker:
    """Text that switches the parser to `then`; a tentative marker starts a call that may fail."""

    text: str
    then: Next
    tentative: bool = True


class ContentState(State):
    """Content up to the first marker; a suffix that may be a marker's beginning waits for more text.
    With `reasoning`, the text goes to reasoning instead (GPT-OSS's analysis channel); with `discard`,
    nowhere (a GPT-OSS message to a built-in tool nobody runs)."""

    def __init__(
        self, markers: Sequence[Marker] = (), reasoning: bool = False, discard: bool = False
    ) -> None:
        self.markers = tuple(markers)
        self._texts = tuple(m.text for m in self.markers)
        self._reasoning = reasoning
        self._discard = discard

    def _emit(self, d: Driver, text: str) -> None:
        if self._discard:
            return
        if self._reasoning:
            d.emit.reasoning(text)
        else:
            d.emit.content(text)

    def step(self, d: Driver) -> bool:
        if not d.buf:
            return False
        found = min(
            ((d.buf.find(m.text), i) for i, m in enumerate(self.markers) if m.text in d.buf), default=None
        )
        if found is not None:
            at, i = found
            self._emit(d, d.consume(at))
            self._enter(d, self.markers[i])
            return True
        keep = 0 if d.final else partial_suffix(d.buf, self._texts)
        if keep == len(d.buf):
            return False
        self._emit(d, d.consume(len(d.buf) - keep))
        return True

    @staticmethod
    def _enter(d: Driver, marker: Marker) -> None:
        if marker.tentative:
            d.begin_tentative()
        d.consume(len(marker.text))
        d.state = marker.then()


class PatternState(State):
    """Text that must match `pattern` here (waiting while it still may); `then` gets the match. Without
    a match the parse fails, or goes on with `otherwise` when there is one (nothing consumed)."""

    def __init__(
        self, pattern: str, then: Callable[[Driver, regex.Match[str]], State], otherwise: Next | None = None
    ) -> None:
        self.pattern = _compiled(pattern)
        self.then, self.otherwise = then, otherwise

    def step(self, d: Driver) -> bool:
        match = self.pattern.match(d.buf, partial=not d.final)
        if match is None:
            if self.otherwise is None:
                raise ParseFailure(f"expected {self.pattern.pattern!r}")
            d.state = self.otherwise()
            return True
        if match.partial:
            return False
        d.consume(match.end())
        d.state = self.then(d, match)
        return True


_PATTERNS: dict[str, regex.Pattern[str]] = {}


def _compiled(pattern: str) -> regex.Pattern[str]:
    if pattern not in _PATTERNS:
        _PATTERNS[pattern] = regex.compile(pattern)
    return _PATTERNS[pattern]


def expect(pattern: str, then: Next, otherwise: Next | None = None) -> PatternState:
    return PatternState(pattern, lambda d, m: then(), otherwise)


class Sink:
    """Where a JSON value's pieces go."""

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        raise NotImplementedError

    def end(self, d: Driver) -> None:
        """The value is complete."""


class JsonState(State):
    """One JSON value (leading whitespace skipped), its pieces routed to `sink`; then `then`."""

    def __init__(self, sink: Sink, then: Next) -> None:
        self.sink, self.then = sink, then
        self.reader = JsonReader()

    def step(self, d: Driver) -> bool:
        if not d.buf:
            if d.final and not self.reader.done:
                self._finish(d)
                return True
            return False
        try:
            n = self.reader.feed(d.buf)
        except JsonSyntaxError as e:
            self.sink.pieces(d, self.reader.take())
            d.consume(e.consumed)
            raise ParseFailure(str(e)) from None
        self.sink.pieces(d, self.reader.take())
        d.consume(n)
        if self.reader.done:
            self.sink.end(d)
            d.state = self.then()
        return True

    def _finish(self, d: Driver) -> None:
        try:
            self.reader.finish()
        except JsonSyntaxError:
            raise ParseFailure("the output ended inside JSON") from None
        self.sink.pieces(d, self.reader.take())
        self.sink.end(d)
        d.state = self.then()


class ArgumentsSink(Sink):
    """The whole value is the call's arguments (the call is already open). The first piece commits a
    tentative call: once its JSON has begun, a call announced by a header is a call."""

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        for piece in pieces:
            d.commit()
            d.emit.arguments(piece.text)


@dataclass(frozen=True)
class CallKeys:
    """The members of a call object: which keys hold the name, arguments and id; `before_name` lists the
    keys allowed before the name (None: any order)."""

    name: tuple[str, ...] = ("name",)
    arguments: tuple[str, ...] = ("arguments",)
    id: tuple[str, ...] = ()
    before_name: tuple[str, ...] | None = None

    def role(self, key: str) -> str | None:
        for role in ("name", "arguments", "id"):
            if key in getattr(self, role):
                return role
        return None


class CallObjectSink(Sink):
    """A call as a JSON object at `base`: the call opens (and commits) once its name is known, with the
    model's id when it came before the name (one after it still names the call in a final parse, as in
    llama.cpp's; a stream sent its id with the name); arguments before the name wait for it. Arguments
    given as a JSON string are the string's text, as llama.cpp takes them."""

    def __init__(self, keys: CallKeys, base: Path = ()) -> None:
        self.keys, self.base = keys, base
        self._member: str | None = None
        self._strings: dict[str, str] = {}
        self._opened = False
        self._held: list[str] = []
        self._string_arguments = False
        self._index = -1  # the call's index, once it is open

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        for piece in pieces:
            relative = piece.path[len(self.base) :]
            if relative:
                self._member_piece(d, piece, relative)
            else:
                self._own_piece(piece)

    def end(self, d: Driver) -> None:
        if not self._opened:
            raise ParseFailure("a call object without a name")

    def _own_piece(self, piece: Piece) -> None:
        if piece.kind is Kind.OPEN and piece.text != "{":
            raise ParseFailure("a call must be a JSON object")
        if piece.kind is Kind.KEY:
            self._member = self.keys.role(piece.raw) or ""
            allowed = self.keys.before_name
            if (
                not self._opened
                and allowed is not None
                and self._member != "name"
                and piece.raw not in allowed
            ):
                raise ParseFailure(f"{piece.raw!r} before the call's name")

    def _member_piece(self, d: Driver, piece: Piece, relative: Path) -> None:
        role = self._member
        if role == "arguments":
            self._arguments(d, piece, len(relative) == 1)
        elif role in ("name", "id") and len(relative) == 1:
            self._string_member(d, role, piece)

    def _string_member(self, d: Driver, role: str, piece: Piece) -> None:
        if piece.kind is Kind.STRING:
            self._strings[role] = self._strings.get(role, "") + piece.raw
        elif piece.kind is Kind.STRING_CLOSE and role == "name":
            self._open(d)
        elif piece.kind is Kind.STRING_CLOSE and self._opened and not d.streaming:
            d.emit.name_id(self._index, self._strings.get("id", ""))
        elif piece.kind not in (Kind.STRING_OPEN, Kind.STRING_CLOSE) and role == "name":
            raise ParseFailure("a call's name must be a string")

    def _arguments(self, d: Driver, piece: Piece, at_member: bool) -> None:
        if at_member and piece.kind is Kind.STRING_OPEN:
            self._string_arguments = True
            return
        if self._string_arguments and at_member:
            text = piece.raw if piece.kind is Kind.STRING else ""
        else:
            text = piece.text
        if self._opened:
            d.emit.arguments(text)
        else:
            self._held.append(text)

    def _open(self, d: Driver) -> None:
        if self._opened:
            raise ParseFailure("a call object with two names")
        self._opened = True
        d.commit()
        self._index = d.emit.next_index
        d.emit.open_call(self._strings.get("name", ""), self._strings.get("id"))
        for text in self._held:
            d.emit.arguments(text)
        self._held = []


class CallArraySink(Sink):
    """A JSON array of call objects at `base`."""

    def __init__(self, keys: CallKeys, base: Path = ()) -> None:
        self.keys, self.base = keys, base
        self._calls: dict[int, CallObjectSink] = {}

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        for piece in pieces:
            relative = piece.path[len(self.base) :]
            if not relative:
                if piece.kind is Kind.OPEN and piece.text != "[":
                    raise ParseFailure("expected an array of calls")
                if piece.kind is Kind.COMMA:
                    self._end_element(d)
                continue
            index = int(relative[0])
            if index not in self._calls:
                self._calls[index] = CallObjectSink(self.keys, (*self.base, index))
            self._calls[index].pieces(d, [piece])

    def end(self, d: Driver) -> None:
        self._end_element(d)

    def _end_element(self, d: Driver) -> None:
        if self._calls:
            self._calls[max(self._calls)].end(d)


class SkipSpace(State):
    """Whitespace dropped (between calls, after the last one), then `then`."""

    def __init__(self, then: Next) -> None:
        self.then = then

    def step(self, d: Driver) -> bool:
        stripped = d.buf.lstrip()
        if len(stripped) < len(d.buf):
            d.consume(len(d.buf) - len(stripped))
            return True
        if d.buf or d.final:
            d.state = self.then()
            return True
        return False


class Commit(State):
    """Ends a tentative stretch that turned out fine without a call (a dropped header), then `then`."""

    def __init__(self, then: Next) -> None:
        self.then = then

    def step(self, d: Driver) -> bool:
        d.commit()
        d.state = self.then()
        return True


class Tentative(State):
    """Starts a tentative stretch (what follows may fail back to content), then `then`."""

    def __init__(self, then: Next) -> None:
        self.then = then

    def step(self, d: Driver) -> bool:
        d.begin_tentative()
        d.state = self.then()
        return True


class GiveBack(State):
    """A marker turned out not to start a call: its text is content; then `then`."""

    def __init__(self, then: Next) -> None:
        self.then = then

    def step(self, d: Driver) -> bool:
        d.give_back()
        d.state = self.then()
        return True


class DriverFormat(ToolCallFormat):
    """A format whose parser is this module's Driver: the format names its first state, the rest is
    shared (ids, llama-server's streaming or final parse)."""

    def parser(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
        reading: AnswerReading = READ_ALL,
    ) -> Driver:
        return Driver(self.start_state(tools), new_id or self.new_id(), stream_arguments, reading)

    def answer_parser(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
        reading: AnswerReading = READ_ALL,
    ) -> ToolCallParser | None:
        parser = None
        if reading.calls or self.markup_without_calls:
            parser = self.parser(tools, new_id, stream_arguments, reading)
        if reading.fenced_json and self.fenced_json_answers:
            return FencedJson(parser)
        return parser

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        """Where parsing an answer starts (`tools` type MiniMax's XML arguments)."""
        raise NotImplementedError
