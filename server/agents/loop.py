"""The server-side tool loop: configured MCP servers offered to the model as function tools, the calls it
makes run by Llamba, their results fed back, and generation continued, round after round, as one request.

A chat (or Responses) request names MCP servers with the Responses API's `mcp` tool (`{"type": "mcp",
"server_label": ..., "allowed_tools": [...]}`, server/chat/tool_schemas.py): a configured server by its
label, or a remote one by its `server_url` (with `headers`) when --mcp-allow-hosts admits the host
(server/mcp/egress.py: a refused URL is a 400 naming server_url, and nothing is connected to). Their
tools reach the model under the registry's names (`<server>_<tool>`, server/mcp/registry.py), next to
the function tools the client declared.

- Rounds. Each round is a new engine request (`EngineClient.events`) whose prompt is the previous one
  plus the model's calls and the tools' results, so the slot's cached prefix (or the host prompt cache)
  is reused and only the new tail is processed.
- tool_choice. The client's in the first round; "auto" in the following ones (OpenAI forces a tool only
  once). The tools are described in every round, also under "auto" on a template without tool support
  (where a client's own loop gets them left out, as llama-server leaves them): this loop is bounded and
  its last round only answers, so it cannot run on until the context fills; in the
  round after the last allowed one (`--tool-max-rounds`, `max_tool_rounds`) the model may only answer,
  so a run always ends in an answer: the tools stay in the prompt (its cached prefix still holds) under
  the format's answer-only grammar (the generic JSON format's `{"response": ...}`), or, for formats
  without one, they are left out as with tool_choice "none".
- The end. A round without MCP calls ends the run with its own finish reason. Calls of the client's own
  function tools are returned to it (finish_reason tool_calls) after the MCP calls of the same round ran;
  so are calls that wait for the client's approval (`AgentPlan.approval`: the Responses API's
  `require_approval`; `awaiting`), which are not run.
- Approval. A chat request's `approved_tools` (Llamba's; the web UI fills it) names the tools that write
  or run commands (not read-only) the user allowed. A round that calls any other such tool pauses the
  run before anything of that round runs: the reply ends there with finish_reason "tool_calls", the
  round's calls in its assistant message as a client's function calls are, and `pending_approval` (the
  names of the tools that wait) on the choice (the whole reply's, or the stream's finish chunk). The
  client asks the user, then sends the conversation again ending in that assistant message
  (`resumption`): with the tool now in approved_tools, the calls of the server's tools that have no
  tool message yet run first (their results streamed as usual) and the run goes on; a call the user
  denied is answered by the client's own tool message (the web UI's "The user denied running NAME."),
  which the model reads. A resumed run counts as past its first round (tool_choice is then "auto":
  the forced call was made). A call still unapproved in a resumption is a 400. Without the field every
  offered tool runs and no run pauses.
- Calls. A Responses request's `max_tool_calls` bounds the MCP calls of the run (`AgentLimits.max_calls`):
  a call past it is not run (its result says so) and the next round may only answer.
- Faults. A call that fails, times out, or whose server crashed becomes an error result the model reads
  (`Error: ...`), never a 5xx.
- Stop. The run is an async generator driven by the response (or a resumable session): cancelling it
  (client gone, DELETE /v1/stream) cancels the engine request or the MCP calls in flight, and those send
  the MCP server `notifications/cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from pydantic import ValidationError

from engine.api import TokenEvent, ToolCall
from server.agents.toolbox import Tool, Toolbox
from server.builtin_tools import ToolContext
from server.chat.generation import Outcome
from server.chat.job import ChatJob
from server.chat.schemas import ChatCompletionRequest, ChatMessage
from server.chat.tool_schemas import FunctionTool, McpServerTool, NamedToolChoice
from server.config.settings import Settings
from server.http import errors
from server.mcp import MCP_FAILURES, HostRefused, McpServerConfig, McpTool, ToolResult
from server.mcp.config import url_transport
from server.model.host import ModelHost

log = structlog.get_logger("agents")

# A tool result longer than this is cut (with a note): one SSE event must stay well inside the resumable
# stream's ring buffer (4 MiB by default), and the model's context is far smaller anyway.
MAX_RESULT_CHARS = 256 * 1024
# (the round's chat request, answer only: the tools stay in the prompt but cannot be called) -> its job
Prepare = Callable[[ChatCompletionRequest, bool], Awaitable[ChatJob]]


# -- the plan: which tools, what limits --------------------------------------------------------------
@dataclass(frozen=True)
class AgentLimits:
    max_rounds: int  # rounds of MCP calls; the round after the last one answers without tools
    tool_timeout_s: float  # each MCP call (a server's own shorter timeout_ms still applies)
    max_tokens: int  # tokens generated over all rounds; -1: no limit
    max_calls: int = -1  # MCP calls over all rounds (the Responses API's max_tool_calls); -1: no limit


@dataclass(frozen=True)
class AgentPlan:
    """The MCP tools one request offers the model, by the name it calls them, and its limits."""

    tools: dict[str, Tool]
    definitions: tuple[FunctionTool, ...]  # the same tools as the function tools the model is shown
    limits: AgentLimits
    context: ToolContext | None = None  # the built-in tools' (the request's x-tool-cwd), else the server's
    # The tools (by the name the model calls them) whose calls wait for the client's approval (Responses
    # API: an mcp_approval_request item ends the run instead of the call).
    approval: frozenset[str] = frozenset()
    # The request's approved_tools (None: not given): a call of a tool that writes or runs commands and is
    # not named here (by either name) pauses the run before it (`unapproved`, `AgentRun.pending`).
    approved: frozenset[str] | None = None

    def unapproved(self, tool: Tool) -> bool:
        if self.approved is None or getattr(tool, "read_only", False):
            return False
        return tool.name not in self.approved and tool.tool not in self.approved


def agent_limits(settings: Settings, body: ChatCompletionRequest) -> AgentLimits:
    """The request's limits under the server's (a request may lower them, never raise them: 400)."""
    rounds = body.max_tool_rounds or settings.tool_max_rounds
    if rounds > settings.tool_max_rounds:
        raise errors.invalid_request(
            f"'max_tool_rounds': at most {settings.tool_max_rounds} on this server (--tool-max-rounds)"
        )
    timeout = body.tool_timeout or settings.tool_timeout
    if timeout > settings.tool_timeout:
        raise errors.invalid_request(
            f"'tool_timeout': at most {settings.tool_timeout:g} s on this server (--tool-timeout)"
        )
    asked, cap = body.max_new_tokens(-1), settings.tool_max_tokens
    if 0 <= cap < asked:
        raise errors.invalid_request(
            f"'max_tokens': a tool-loop run may generate at most {cap} tokens here (--tool-max-tokens)"
        )
    tokens = asked if asked >= 0 else settings.n_predict
    if cap >= 0:
        tokens = cap if tokens < 0 else min(tokens, cap)
    return AgentLimits(rounds, timeout, tokens)


async def agent_plan(
    mcp: Toolbox | None,
    settings: Settings,
    body: ChatCompletionRequest,
    context: Callable[[], ToolContext | None] = lambda: None,
    approvals: bool = False,
) -> AgentPlan | None:
    """The plan of a request with `mcp` tools (None without): every problem a 4xx before any byte.
    `approvals`: the API can ask the client to approve a call (the Responses API); elsewhere a
    `require_approval` other than "never" is a 400, and a request-named server's calls run."""
    servers = body.mcp_tools()
    if not servers:
        return None
    if mcp is None:
        raise errors.invalid_request(
            "'tools': mcp tools need MCP servers configured on this server (--mcp-servers-config), "
            "hosts a request may name (--mcp-allow-hosts), or built-in tools (--tools)"
        )
    await mcp.wait_ready()  # bounded: the start-up warm-up has a timeout
    limits = agent_limits(settings, body)
    offered = [(spec, await offered_tools(mcp, spec, limits)) for spec in servers]
    tools = {tool.name: tool for _, listed in offered for tool in listed}
    asks = {
        tool.name
        for spec, listed in offered
        if approvals or spec.require_approval not in (None, "never")
        for tool in listed
        if spec.needs_approval(tool.tool, bool(getattr(tool, "read_only", False)))
    }
    if asks and not approvals:
        raise errors.invalid_request(
            "'require_approval': only the Responses API can ask for approval (an mcp_approval_request); "
            'give "never" to let the server run the calls'
        )
    clash = sorted(tools.keys() & {t.function.name for t in body.function_tools()})
    if clash:
        raise errors.invalid_request(f"'tools': function tool {clash[0]!r} has an MCP tool's name")
    choice = body.tool_choice
    if isinstance(choice, NamedToolChoice):
        named = choice.function.name
        if named not in tools and named not in {t.function.name for t in body.function_tools()}:
            raise errors.invalid_request(f"'tool_choice' names {named!r}, which is not among the tools")
    about = {tool.name: spec.server_description for spec, listed in offered for tool in listed}
    definitions = tuple(d for d in (definition(t, about[t.name]) for t in tools.values()) if d is not None)
    usable = {d.function.name: tools[d.function.name] for d in definitions}
    approved = None if body.approved_tools is None else frozenset(body.approved_tools)
    return AgentPlan(usable, definitions, limits, context(), frozenset(asks & usable.keys()), approved)


async def offered_tools(mcp: Toolbox, spec: McpServerTool, limits: AgentLimits) -> list[Tool]:
    """The tools of one `mcp` entry: its server's (a configured one, or one the request names by
    server_url), narrowed by allowed_tools."""
    label = spec.server_label
    if spec.is_remote():
        offered: list[Tool] = list(await named_server_tools(mcp, spec, limits))
    else:
        if spec.headers is not None or spec.authorization is not None:
            raise errors.invalid_request(
                f"'headers': only a server named by server_url takes headers or authorization; the "
                f"configured server {label!r} has its own"
            )
        if label not in mcp.server_names():
            known = ", ".join(mcp.server_names())
            raise errors.invalid_request(
                f"'server_label': no MCP server {label!r} here (configured: {known}); a server of the "
                "request's own needs its server_url"
            )
        offered = mcp.server_tools(label)
        if not offered:
            raise errors.unavailable(f"MCP server {label!r} is not available: it did not start (see the log)")
    names, read_only = spec.tool_filter()
    if names is not None:
        unknown = sorted(names - {t.tool for t in offered} - {t.name for t in offered})
        if unknown:
            raise errors.invalid_request(f"'allowed_tools': MCP server {label!r} has no tool {unknown[0]!r}")
        offered = [t for t in offered if t.tool in names or t.name in names]
    if read_only:
        offered = [t for t in offered if getattr(t, "read_only", False)]
    if not offered:
        raise errors.invalid_request(f"'allowed_tools': no tool of MCP server {label!r} is left")
    return offered


async def named_server_tools(mcp: Toolbox, spec: McpServerTool, limits: AgentLimits) -> list[McpTool]:
    """The tools of a server the request names by URL, listed over a connection of their own: a URL
    --mcp-allow-hosts refuses (its host, an address it resolves to, a redirect) is a 400 naming
    server_url, and no connection is made; a server that cannot be listed is a 424."""
    url = spec.server_url or ""
    try:
        config = McpServerConfig(
            name=spec.server_label, transport=url_transport(url), url=url, headers=spec.request_headers(),
            timeout_ms=max(1, round(limits.tool_timeout_s * 1000)),
        )  # fmt: skip
        return await mcp.list_named(config)
    except (HostRefused, ValidationError) as exc:
        said = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        where = f"'server_url' (server {spec.server_label!r})"
        raise errors.invalid_request(f"{where}: {said.removeprefix('Value error, ')}") from None
    except MCP_FAILURES as exc:
        raise errors.failed_dependency(
            f"'server_url': the MCP server {spec.server_label!r} could not list its tools: {exc}"
        ) from None


def definition(tool: Tool, about: str | None = None) -> FunctionTool | None:
    """The tool as a function tool (`about`, its server's description, before its own); None (logged)
    when its input schema is not a valid JSON schema."""
    spec = tool.to_json()["definition"]
    if about:
        own = spec["function"].get("description")
        spec = {
            **spec,
            "function": {**spec["function"], "description": f"{about}\n\n{own}" if own else about},
        }
    try:
        return FunctionTool.model_validate(spec)
    except ValidationError as exc:
        log.warning("agents.tool_skipped", tool=tool.name, reason=str(exc.errors()[0]["msg"]))
        return None


# -- what a run yields besides the engine's token events ---------------------------------------------
@dataclass(frozen=True)
class RoundStarted:
    index: int
    job: ChatJob


@dataclass(frozen=True)
class ToolExecuted:
    """One MCP call's outcome, as the model reads it (an error is `Error: ...`, flagged is_error)."""

    call: ToolCall
    content: str
    is_error: bool

    @classmethod
    def of(cls, call: ToolCall, result: ToolResult) -> ToolExecuted:
        text = f"Error: {result.error}" if result.error is not None else result.text or ""
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[cut: the result had {len(text)} characters]"
        return cls(call, text, result.error is not None)

    def message(self) -> dict[str, Any]:
        """The `tool` message added to the conversation (and reported to the client)."""
        return {
            "role": "tool",
            "tool_call_id": self.call.id,
            "name": self.call.name,
            "content": self.content,
            "is_error": self.is_error,
        }


AgentEvent = TokenEvent | RoundStarted | ToolExecuted


@dataclass
class Round:
    job: ChatJob
    index_offset: int  # tool-call indices run on across a run's rounds: each call has its own
    outcome: Outcome = field(default_factory=Outcome)
    executed: bool = False  # its MCP calls ran (it is then part of the intermediate messages)

    def shifted(self, event: TokenEvent) -> TokenEvent:
        if not event.tool_calls or not self.index_offset:
            return event
        steps = tuple(replace(s, index=s.index + self.index_offset) for s in event.tool_calls)
        return replace(event, tool_calls=steps)


# -- the run ----------------------------------------------------------------------------------------
class AgentRun:
    """One request's tool loop. `start()` prepares the first round (its 4xx come before any byte);
    `events()` runs the rounds; then `finish_reason`, `messages`, `final_outcome()` and `usage()` tell
    what happened."""

    def __init__(
        self,
        model: ModelHost,
        body: ChatCompletionRequest,
        plan: AgentPlan,
        mcp: Toolbox,
        prepare: Prepare,
    ) -> None:
        self.model, self.body, self.plan, self.mcp, self.prepare = model, body, plan, mcp, prepare
        self.rounds: list[Round] = []
        self.messages: list[dict[str, Any]] = []  # what the run added before its final message
        self.finish_reason = "stop"
        self.error: errors.APIError | None = None  # a later round could not be prepared
        self.awaiting: list[ToolCall] = []  # MCP calls waiting for the client's approval (not run)
        self.pending: list[ToolCall] = []  # calls of unapproved writing tools: the run paused before them
        self._first: ChatJob | None = None
        self._client_calls: list[ToolCall] = []
        self._resumed: list[ToolCall] | None = None  # a paused run's calls, now approved, to run first

    async def start(self) -> ChatJob:
        self._first = await self.prepare(self.round_body(0), self.answer_only(0))
        return self._first

    async def open(self) -> None:
        """The chat route's start: a paused run's continuation (`resumption`; a 400 for a call still not
        approved) runs its approved calls first and prepares its first round after them, in `events()`;
        any other run prepares its first round now, so its 4xx come before any byte."""
        self._resumed = resumption(self.body, self.plan)
        if self._resumed is None:
            await self.start()

    def pending_approval(self) -> list[str]:
        """The tools whose calls wait for the user's approval (the run paused before them), by name."""
        return sorted({c.name for c in self.pending})

    @property
    def n_generated(self) -> int:
        return sum(r.outcome.n_generated for r in self.rounds)

    def round_body(self, index: int) -> ChatCompletionRequest:
        """The chat request of round `index`: the conversation so far, every tool as a function tool,
        the round's tool_choice, and what is left of the token budget."""
        budget = self.plan.limits.max_tokens
        update: dict[str, Any] = {
            "tools": [*self.body.function_tools(), *self.plan.definitions],
            "tool_choice": self.round_choice(index),
            "max_tool_rounds": None,
            "tool_timeout": None,
            "approved_tools": None,
            "max_tokens": budget if budget < 0 else budget - self.n_generated,
            "max_completion_tokens": None,
            "n_predict": None,
        }
        if index > 0 or self.messages:
            added = [ChatMessage.model_validate(m) for m in self.messages]
            update |= {"messages": [*self.body.messages, *added]}
            update |= {"continue_final_message": None, "add_generation_prompt": None}
        body = self.body.model_copy(update=update)
        body._keep_tools = True  # described in every round (ToolFields._keep_tools): see the docstring
        return body

    def round_choice(self, index: int) -> Any:
        asked = self.body.tool_choice
        return asked if index == 0 or asked in (None, "none") else "auto"

    def answer_only(self, index: int) -> bool:
        calls = self.plan.limits.max_calls
        return index >= self.plan.limits.max_rounds or 0 <= calls <= self.n_calls

    @property
    def n_calls(self) -> int:
        """The MCP calls answered so far (once max_calls are, the next round only answers)."""
        return sum(1 for m in self.messages if m["role"] == "tool")

    async def events(self) -> AsyncIterator[AgentEvent]:
        """The run's events, round after round. Its end (finished, failed or cancelled with its request)
        is logged with the rounds it ran: after that line no round of this run starts."""
        try:
            async with contextlib.aclosing(self._rounds()) as rounds:
                async for event in rounds:
                    yield event
        finally:
            log.info("agents.run_ended", rounds=len(self.rounds), finish_reason=self.finish_reason)

    async def _rounds(self) -> AsyncIterator[AgentEvent]:
        job, index = self._first, 0
        if self._resumed is not None:  # a paused run goes on: its approved calls, then its next round
            async with contextlib.aclosing(self.execute(self._resumed)) as results:
                async for result in results:
                    self.messages.append(result.message())
                    yield result
            index = 1
            job = await self.next_job(index)
        while job is not None:
            yield RoundStarted(index, job)
            current = Round(job, sum(len(r.outcome.tool_calls) for r in self.rounds))
            self.rounds.append(current)
            async with contextlib.aclosing(self.model.client.events(job.request)) as events:
                async for event in events:
                    current.outcome.add(event)
                    yield current.shifted(event)
            calls = current.outcome.tool_calls
            mine = [c for c in calls if c.name in self.plan.tools]
            self.finish_reason = current.outcome.finish_reason
            if self.finish_reason != "tool_calls" or not mine:
                self._client_calls = calls
                return
            self.pending = [c for c in mine if self.plan.unapproved(self.plan.tools[c.name])]
            if self.pending:  # the user decides first: nothing of this round runs, the reply ends here
                log.info("agents.run_paused", pending_approval=self.pending_approval())
                self._client_calls = calls
                return
            current.executed = True
            self.messages.append(assistant_message(current.outcome, mine))
            self.awaiting = [c for c in mine if c.name in self.plan.approval]
            ready = [c for c in mine if c.name not in self.plan.approval]
            async with contextlib.aclosing(self.execute(ready)) as results:
                async for result in results:
                    self.messages.append(result.message())
                    yield result
            self._client_calls = [c for c in calls if c.name not in self.plan.tools]
            if self._client_calls or self.awaiting:  # the client has calls to answer or approve: the end
                return
            index += 1
            job = await self.next_job(index)

    async def next_job(self, index: int) -> ChatJob | None:
        """The next round, or None when the run must end (its tokens spent, the context full)."""
        budget = self.plan.limits.max_tokens
        if budget >= 0 and self.n_generated >= budget:
            self.finish_reason = "length"
            return None
        try:
            return await self.prepare(self.round_body(index), self.answer_only(index))
        except errors.APIError as exc:
            self.finish_reason = "length"
            if exc.error_type != "exceed_context_size_error" or not self.rounds:  # no round: no answer
                self.error = exc
            return None

    async def execute(self, calls: list[ToolCall]) -> AsyncIterator[ToolExecuted]:
        """Run the calls concurrently; their results in call order (a call past max_calls is not run:
        its result says so). Closing the generator (a stop) cancels the calls still running."""
        cap = self.plan.limits.max_calls
        room = len(calls) if cap < 0 else max(0, cap - self.n_calls)
        tasks = [asyncio.ensure_future(self.call(c)) for c in calls[:room]]
        tasks += [asyncio.ensure_future(refused(c, cap)) for c in calls[room:]]
        try:
            for task in tasks:
                yield await task
        finally:
            for task in tasks:
                task.cancel()

    async def call(self, call: ToolCall) -> ToolExecuted:
        return await run_call(self.mcp, self.plan, call)

    # -- what the run produced ------------------------------------------------------------------------
    def final_outcome(self) -> Outcome:
        """The final assistant message: the last round's, unless its MCP calls ran (its text and those
        calls are then intermediate messages): only the client's calls are left."""
        if not self.rounds:  # a resumed run whose first round could not start (`error` says why)
            return Outcome()
        last = self.rounds[-1]
        final = last.outcome.final
        if final is not None:
            final = replace(final, finish_reason=self.finish_reason)
        if not last.executed:
            return replace(last.outcome, final=final)
        return Outcome(tool_calls=list(self._client_calls), final=final)

    def usage(self) -> dict[str, Any]:
        """Usage over all rounds: every round's prompt counts, as OpenAI counts a tool loop's input."""
        n_prompt = sum(r.job.n_prompt for r in self.rounds)
        timings = [r.outcome.timings for r in self.rounds if r.outcome.timings is not None]
        return {
            "completion_tokens": self.n_generated,
            "prompt_tokens": n_prompt,
            "total_tokens": n_prompt + self.n_generated,
            "prompt_tokens_details": {"cached_tokens": sum(t.cache_n for t in timings)},
        }

    def verbose(self) -> list[dict[str, Any]]:
        """Each round's prompt, text and timings (`verbose` / `__verbose`)."""
        return [
            {
                "prompt": r.job.prompt_text,
                "content": r.outcome.text,
                "reasoning_content": r.outcome.reasoning,
                "tool_calls": [c.to_openai() for c in r.outcome.tool_calls],
                "timings": r.outcome.timings.as_dict() if r.outcome.timings else None,
            }
            for r in self.rounds
        ]


async def run_call(mcp: Toolbox, plan: AgentPlan, call: ToolCall) -> ToolExecuted:
    """One MCP call of the plan's tools, as the model reads its outcome (never an exception)."""
    tool = plan.tools[call.name]
    if plan.unapproved(tool):
        log.info("agents.tool_unapproved", tool=call.name)
        return ToolExecuted.of(call, ToolResult(error=unapproved_text(call.name)))
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return ToolExecuted.of(call, ToolResult(error="the arguments are not a JSON object"))
    begin = time.monotonic()
    try:
        result = await mcp.call(tool, arguments, plan.limits.tool_timeout_s, plan.context)
    except Exception as exc:  # never a 5xx: whatever went wrong, the model reads about it
        log.exception("agents.tool_failed", tool=call.name)
        result = ToolResult(error=f"tool '{call.name}' failed: {exc}")
    seconds = round(time.monotonic() - begin, 3)
    log.info("agents.tool_call", tool=call.name, seconds=seconds, error=result.error)
    return ToolExecuted.of(call, result)


def resumption(body: ChatCompletionRequest, plan: AgentPlan) -> list[ToolCall] | None:
    """The calls a paused run runs first when the client sends it again, or None when the request does not
    resume one: without approved_tools (a client that never pauses), or when the conversation does not end
    in an assistant message calling the plan's tools followed only by tool messages. The calls of the
    plan's tools with no tool message yet are returned; one the user still has not approved is a 400."""
    if plan.approved is None:
        return None
    messages, answered = body.messages, set()
    at = len(messages) - 1
    while at >= 0 and messages[at].role == "tool":
        answered.add(messages[at].tool_call_id)
        at -= 1
    turn = messages[at] if at >= 0 else None
    if turn is None or turn.role != "assistant" or not turn.tool_calls:
        return None
    calls = [
        ToolCall(c.id or "", c.function.name, arguments_text(c.function.arguments)) for c in turn.tool_calls
    ]
    if not any(c.name in plan.tools for c in calls):
        return None  # a client's own function calls: its loop, not this one's
    waiting = [c for c in calls if c.name in plan.tools and c.id not in answered]
    refused = [c.name for c in waiting if plan.unapproved(plan.tools[c.name])]
    if refused:
        raise errors.invalid_request(
            f"'approved_tools': the call of {refused[0]!r} waits for the user's approval: name the tool in "
            "approved_tools, or answer the call with a tool message"
        )
    return waiting


def arguments_text(arguments: str | dict[str, Any] | None) -> str:
    """An earlier call's arguments as the JSON text a tool call carries (clients send text or an object)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})


def unapproved_text(name: str) -> str:
    return f"not run: the user has not approved {name} (it writes or runs commands); do not retry it"


async def refused(call: ToolCall, cap: int) -> ToolExecuted:
    return ToolExecuted.of(
        call, ToolResult(error=f"not run: this response may make {cap} tool calls (max_tool_calls)")
    )


def assistant_message(outcome: Outcome, calls: list[ToolCall]) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": outcome.text or None,
        "tool_calls": [c.to_openai() for c in calls],
    }
    if outcome.reasoning:
        message["reasoning_content"] = outcome.reasoning
    return message
