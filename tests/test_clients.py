"""The client libraries teams use, against the managed llama-server (issue 57; patches 0045-0048): LangChain, the
Anthropic SDK, the OpenAI Agents SDK, plain openai and httpx, on SmolLM2-135M-Instruct (ChatML: a template without a
tool syntax, so tool calls take the generic JSON form) and the synthetic DeepSeek-V4 / GLM-5 / DeepSeek-V3.2 (thinking
off). Each test asserts what a user of the library checks: the parsed call's name and argument types and ranges, the
text. Client versions are pinned in the test extra (pyproject.toml)."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pyllm_a100.synth.chat import chat_format
from pyllm_a100.synth.presets import preset

FAMILY_PRESETS = ["tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32"]


def thinking_off(name: str) -> dict:
    """The thinking switch each synthetic family's template reads (V4 and V3.2: thinking; GLM: enable_thinking)."""
    return chat_format(preset(name).family).thinking(False)


@dataclasses.dataclass(frozen=True)
class Endpoint:
    base: str  # http://127.0.0.1:PORT, what the clients are given (+ "/v1" for the OpenAI-shaped ones)
    port: int


def _serve(model: Path) -> Iterator[Endpoint]:
    """The model served as `pyllm serve MODEL --alias m` would (2 slots on 2 cores); stopped after the module."""
    from pyllm_a100 import Server

    with Server(model, port=0, ready_timeout=300, parallel=2, alias="m") as server:
        yield Endpoint(server.base_url, int(server.base_url.rsplit(":", 1)[1]))


@pytest.fixture(scope="module")
def served_smollm2(smollm2: Path) -> Iterator[Endpoint]:
    """SmolLM2 served by pyllm (one start for the module's tests)."""
    yield from _serve(smollm2)


@pytest.fixture(scope="module", params=FAMILY_PRESETS)
def family(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Iterator[tuple[str, Endpoint]]:
    for endpoint in _serve(tiny_models[request.param]):
        yield request.param, endpoint


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2 (ChatML, no tool syntax): LangChain

def chat_model(server, **kw):
    from langchain_openai import ChatOpenAI
    return ChatOpenAI(base_url=server.base + "/v1", api_key="none", model="m", temperature=0, max_retries=0,
                      timeout=300, **kw)


def weather_tool():
    from pydantic import BaseModel, Field

    class get_weather(BaseModel):
        """Current weather of a city."""
        city: str = Field(description="City name", max_length=24)
        days: int = Field(description="Forecast length in days", ge=1, le=7)

    return get_weather


def check_weather_call(call: dict) -> None:
    assert call["name"] == "get_weather", call
    args = call["args"]
    assert isinstance(args["city"], str) and 0 < len(args["city"]) <= 24, args
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7, args


def test_langchain_required_tool_call(served_smollm2):
    llm = chat_model(served_smollm2, max_tokens=128).bind_tools([weather_tool()], tool_choice="required")
    msg = llm.invoke("What is the weather in Paris?")
    assert msg.tool_calls, (msg.content, msg.response_metadata)
    check_weather_call(msg.tool_calls[0])
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_langchain_named_tool_call(served_smollm2):
    from langchain_core.tools import tool

    @tool
    def get_time(city: str) -> str:
        """Local time of a city."""
        return "12:00"

    llm = chat_model(served_smollm2, max_tokens=128).bind_tools([get_time, weather_tool()], tool_choice="get_weather")
    msg = llm.invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather", msg
    check_weather_call(msg.tool_calls[0])


def test_langchain_required_tool_call_streamed(served_smollm2):
    llm = chat_model(served_smollm2, max_tokens=128).bind_tools([weather_tool()], tool_choice="required")
    full = None
    for chunk in llm.stream("What is the weather in Paris?"):
        full = chunk if full is None else full + chunk
    assert full is not None and full.tool_calls, full
    check_weather_call(full.tool_calls[0])


def test_langchain_auto_answers_or_calls(served_smollm2):
    """auto on a template without a tool syntax: prose, or a call in the generic form that parses; never an error."""
    llm = chat_model(served_smollm2, max_tokens=64).bind_tools([weather_tool()])
    msg = llm.invoke("What is the capital of France?")
    if msg.tool_calls:
        check_weather_call(msg.tool_calls[0])
    else:
        assert isinstance(msg.content, str) and msg.content.strip(), msg


def test_auto_reply_in_the_generic_form_is_a_call(served_smollm2):
    """auto: a reply that opens with the generic form is held to the tool's schema from its "{" on and parsed as a
    call (asked for here, since SmolLM2 rarely chooses a call on its own); days 99 is out of the schema's 1..7."""
    from openai import OpenAI
    api = OpenAI(base_url=served_smollm2.base + "/v1", api_key="none", max_retries=0)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                               "parameters": ANTHROPIC_TOOL["input_schema"]}}]
    q = ('Repeat exactly, with nothing else: '
         '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 99}}]}')
    calls = []
    # the same greedy request three times: SmolLM2's first (cold-prompt) reply is prose, the cached ones a call
    for i in range(3):
        r = api.chat.completions.create(model="m", messages=[{"role": "user", "content": q}], tools=tools,
                                        max_tokens=80, temperature=0)
        message = r.choices[0].message
        if message.tool_calls:
            calls.append((message.tool_calls[0].function.name, json.loads(message.tool_calls[0].function.arguments)))
        else:
            assert "tool_calls" not in (message.content or "")[:20], message.content  # the form is never left as text
    assert calls
    for name, args in calls:
        assert name == "get_weather" and isinstance(args["city"], str) and 1 <= args["days"] <= 7, args


def test_langchain_streaming_text(served_smollm2):
    chunks = [c.content for c in chat_model(served_smollm2, max_tokens=32).stream("What is the capital of France?")]
    assert len(chunks) > 1 and "".join(chunks).strip(), chunks


def test_langchain_structured_output(served_smollm2):
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=32)
        population_millions: float = Field(ge=0, le=50)
        rank: int = Field(ge=1, le=10)

    city = chat_model(served_smollm2, max_tokens=96).with_structured_output(City, method="json_schema").invoke(
        "Describe Paris as JSON.")
    assert isinstance(city, City) and city.name
    assert 0 <= city.population_millions <= 50 and 1 <= city.rank <= 10, city


def test_langchain_tool_result_second_turn(served_smollm2):
    """The call and its result go back in the history; the template renders them and the model answers."""
    from langchain_core.messages import HumanMessage, ToolMessage
    tools = [weather_tool()]
    llm = chat_model(served_smollm2, max_tokens=64)
    first = llm.bind_tools(tools, tool_choice="required").invoke([HumanMessage("What is the weather in Paris?")])
    assert first.tool_calls
    call = first.tool_calls[0]
    history = [HumanMessage("What is the weather in Paris?"), first,
               ToolMessage("18 degrees Celsius and sunny", tool_call_id=call["id"])]
    second = llm.bind_tools(tools, tool_choice="none").invoke(history)
    assert isinstance(second.content, str) and second.content.strip() and not second.tool_calls, second


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2: the Anthropic SDK (/v1/messages)

ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather of a city",
                  "input_schema": {"type": "object", "properties": {
                      "city": {"type": "string", "maxLength": 24},
                      "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}


def anthropic_client(server):
    import anthropic
    return anthropic.Anthropic(base_url=server.base, api_key="none", max_retries=0, timeout=300)


def check_tool_use(block) -> None:
    assert block.type == "tool_use" and block.name == "get_weather", block
    assert isinstance(block.input["city"], str) and block.input["city"], block.input
    assert isinstance(block.input["days"], int) and 1 <= block.input["days"] <= 7, block.input


def test_anthropic_named_tool_use(served_smollm2):
    msg = anthropic_client(served_smollm2).messages.create(
        model="m", max_tokens=128, tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses, msg.content
    check_tool_use(uses[0])
    assert msg.stop_reason == "tool_use"


def test_anthropic_named_tool_use_streamed(served_smollm2):
    with anthropic_client(served_smollm2).messages.stream(
            model="m", max_tokens=128, tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}]) as stream:
        msg = stream.get_final_message()
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses, msg.content
    check_tool_use(uses[0])


def test_anthropic_tool_result_turn(served_smollm2):
    client = anthropic_client(served_smollm2)
    first = client.messages.create(
        model="m", max_tokens=128, tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    use = next(b for b in first.content if b.type == "tool_use")
    second = client.messages.create(
        model="m", max_tokens=64, tools=[ANTHROPIC_TOOL], tool_choice={"type": "none"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"},
                  {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "18 degrees Celsius and sunny"}]}])
    text = "".join(b.text for b in second.content if b.type == "text")
    assert text.strip(), second.content


def test_anthropic_text_streamed(served_smollm2):
    with anthropic_client(served_smollm2).messages.stream(
            model="m", max_tokens=32, messages=[{"role": "user", "content": "What is the capital of France?"}]) as s:
        parts = list(s.text_stream)
    assert len(parts) > 1 and "".join(parts).strip(), parts


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2: the OpenAI Agents SDK (one turn: tool call, result back, final answer)

def test_openai_agents_turn(served_smollm2):
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI
    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        seen.append(city)
        return f"18 degrees Celsius and sunny in {city}."

    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="m", openai_client=AsyncOpenAI(
                      base_url=served_smollm2.base + "/v1", api_key="none", max_retries=0)),
                  model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=96))
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert seen and all(isinstance(c, str) and c for c in seen), seen
    assert isinstance(result.final_output, str) and result.final_output.strip(), result


# ---------------------------------------------------------------------------------------------------------------
# JSON-schema bounds in tool arguments, every family (the generic form on SmolLM2)

BOUNDS_TOOL = {"type": "function", "function": {
    "name": "set_level", "description": "Set a level",
    "parameters": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3, "maximum": 7},
        "x": {"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.5},
        "neg": {"type": "number", "minimum": -1.25, "maximum": -0.5},
        "opt": {"type": "object", "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"]},
            "tag": {"type": "string", "maxLength": 4},
            "level": {"type": "number", "minimum": 10, "maximum": 20}},
            "required": ["mode", "tag", "level"]},
        "list": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": -2, "maximum": 2}},
        "unit": {"type": "string", "enum": ["cm", "inch"]},
        "kind": {"const": "level"},
        "label": {"type": "string", "maxLength": 6}},
        "required": ["n", "x", "neg", "opt", "list", "unit", "kind", "label"]}}}


def chars(text: str) -> int:
    # the grammar counts characters; a malformed byte sequence it let through (one character to it) comes back as
    # up to four U+FFFD (vendor patch 0012/0019), which are not counted (as in the package's tests/test_tools.py)
    return len(text) - text.count("\ufffd")


def check_bounds(args: dict) -> None:
    assert isinstance(args["n"], int) and 3 <= args["n"] <= 7, args
    assert isinstance(args["x"], (int, float)) and 0.5 <= args["x"] < 2.5, args
    assert isinstance(args["neg"], (int, float)) and -1.25 <= args["neg"] <= -0.5, args
    opt = args["opt"]
    assert opt["mode"] in ("fast", "slow") and isinstance(opt["tag"], str) and chars(opt["tag"]) <= 4, args
    assert args["unit"] in ("cm", "inch") and args["kind"] == "level", args
    assert isinstance(args["label"], str) and chars(args["label"]) <= 6, args
    assert isinstance(opt["level"], (int, float)) and 10 <= opt["level"] <= 20, args
    assert isinstance(args["list"], list) and len(args["list"]) <= 3, args
    assert all(isinstance(v, int) and -2 <= v <= 2 for v in args["list"]), args


def openai_client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=600)


def bounded_calls(server, kwargs: dict, n: int, max_tokens: int) -> list[dict]:
    """n requests under "required" (every other one streamed), seeds and temperatures varied; the calls that ended."""
    api = openai_client(server)
    calls, cut = [], 0
    for i in range(n):
        body = dict(model="m", messages=[{"role": "user", "content": "Set the level."}], tools=[BOUNDS_TOOL],
                    tool_choice="required", parallel_tool_calls=False, max_tokens=max_tokens, seed=100 + i,
                    temperature=[0.0, 0.7, 1.0, 1.3][i % 4],
                    extra_body={"chat_template_kwargs": kwargs} if kwargs else None)
        if i % 2:
            arguments, names, finish = "", "", None
            for chunk in api.chat.completions.create(stream=True, **body):
                for choice in chunk.choices:
                    for tc in choice.delta.tool_calls or []:
                        names += (tc.function.name or "") if tc.function else ""
                        arguments += (tc.function.arguments or "") if tc.function else ""
                    finish = choice.finish_reason or finish
        else:
            choice = api.chat.completions.create(**body).choices[0]
            finish = choice.finish_reason
            calls_ = choice.message.tool_calls or []
            names = calls_[0].function.name if calls_ else ""
            arguments = calls_[0].function.arguments if calls_ else ""
        if finish == "length":
            cut += 1  # random weights can run a free string past max_tokens: nothing to check
            continue
        assert finish == "tool_calls" and names == "set_level", (finish, names, arguments)
        calls.append(json.loads(arguments))
        check_bounds(calls[-1])  # stops at the first call out of the schema
    print(f"{len(calls)} calls checked, {cut} cut at max_tokens")
    return calls


def test_bounds_in_tool_arguments_generic(served_smollm2):
    assert bounded_calls(served_smollm2, {}, 6, 300)


def test_bounds_in_tool_arguments_per_family(family):
    name, server = family
    assert bounded_calls(server, thinking_off(name), 10, 900), f"{name}: every reply ran to max_tokens"


def test_bad_tool_schema_is_a_400_per_family(family):
    """A tool whose parameters the grammar cannot read is the request's mistake (the pin: 500 on DSML)."""
    name, server = family
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "nope"}}, "required": ["x"]}}}
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required",
        "max_tokens": 4, "chat_template_kwargs": thinking_off(name)})
    assert r.status_code == 400 and "unrecognized type" in r.text, (r.status_code, r.text[:200])


def test_bounds_in_response_format(served_smollm2):
    schema = BOUNDS_TOOL["function"]["parameters"]
    r = openai_client(served_smollm2).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Give me the settings as JSON."}], max_tokens=200,
        temperature=1.0, seed=7, response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    check_bounds(json.loads(r.choices[0].message.content))


def test_empty_number_range_is_a_400(served_smollm2):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": 2, "maximum": 1}}, "required": ["x"]}}}
    r = httpx.post(served_smollm2.base + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400, (r.status_code, r.text)


def test_required_with_response_format_is_a_400_without_tool_syntax(served_smollm2):
    r = httpx.post(served_smollm2.base + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [BOUNDS_TOOL],
        "tool_choice": "required", "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "response_format" in r.text, (r.status_code, r.text)


# ---------------------------------------------------------------------------------------------------------------
# The connection after a streamed reply

STREAM_BODY = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "stream": True}


def test_connection_kept_after_a_stream(served_smollm2):
    """After a complete streamed reply (no Connection: close), the server keeps the connection for the next request."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", served_smollm2.port, timeout=60)
    for i in range(3):
        conn.request("POST", "/v1/chat/completions", body=json.dumps(STREAM_BODY),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert (resp.getheader("Connection") or "").lower() != "close"
        body = resp.read().decode()
        assert "data: [DONE]" in body, body[-200:]
        time.sleep(0.3)
        sock = conn.sock
        assert sock is not None, f"request {i}: the client dropped the connection"
        sock.setblocking(False)
        try:
            peek = sock.recv(1, socket.MSG_PEEK)
            closed = peek == b""
        except BlockingIOError:
            closed = False
        finally:
            sock.setblocking(True)
        assert not closed, f"request {i}: the server closed the connection after a complete stream"


def test_openai_client_streams_on_one_connection(served_smollm2):
    """What users saw: several streamed requests in a row through one pooled connection, no 'Server disconnected'."""
    from openai import OpenAI
    http_client = httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
    api = OpenAI(base_url=served_smollm2.base + "/v1", api_key="none", max_retries=0, http_client=http_client)
    for _ in range(6):
        text = "".join((c.choices[0].delta.content or "") for c in api.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, stream=True) if c.choices)
        assert text
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)


def test_httpx_stream_then_request_on_one_connection(served_smollm2):
    """httpx (under openai, anthropic, langchain): a streamed reply, then a request on the same pooled connection.
    The pin closed the connection after each stream: some of those requests failed with RemoteProtocolError
    'Server disconnected without sending a response.', the rest reconnected."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    errors, ports = [], set()
    with httpx.Client(base_url=served_smollm2.base, timeout=60, limits=httpx.Limits(max_connections=1)) as c:
        for _ in range(20):
            try:
                with c.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as r:
                    ports.add(r.extensions["network_stream"].get_extra_info("client_addr"))
                    for _ in r.iter_bytes():
                        pass
                r = c.post("/v1/chat/completions", json=body)
                ports.add(r.extensions["network_stream"].get_extra_info("client_addr"))
            except httpx.HTTPError as e:
                errors.append(repr(e))
    assert not errors, errors[:3]
    assert len(ports) == 1, f"{len(ports)} connections for 40 requests"
