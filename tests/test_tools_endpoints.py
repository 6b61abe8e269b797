"""Tool calls through llama-server's other two APIs: OpenAI Responses (/v1/responses) and Anthropic Messages
(/v1/messages), on random-weight DeepSeek-V4 and GLM-5 models (one server per family for the module).

The same contract as tests/test_tools.py in each endpoint's own spelling: a forced call (Responses "required" and
{"type": "function", "name": N}; Messages {"type": "any"} and {"type": "tool", "name": N}) is a well-formed call in
the endpoint's format, "auto" is always answered (never an HTTP 500), and a tool-result turn is accepted. Messages'
named tool and "none" need vendor/patches/0014 (at the pin a named tool was "any", "none" was "auto").
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from test_tools import MAX_CALL_TOKENS, TOOLS, check_call

from pyllm_a100.synth.chat import chat_format
from pyllm_a100.synth.presets import preset

PRESETS = ["tiny-deepseek4", "tiny-glm-dsa"]
QUESTION = "What is the weather in Paris?"
# Responses and Messages spell a function tool flat: {"type": "function", "name": ...} / {"name", "input_schema"}
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
MESSAGES_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                   "input_schema": t["function"]["parameters"]} for t in TOOLS]


def thinking_off(name: str) -> dict:
    return {"chat_template_kwargs": chat_format(preset(name).family).thinking(False)}


@pytest.fixture(scope="module", params=PRESETS)
def served(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Iterator[tuple[str, object]]:
    """One managed server per family for every test of the module (a start is ~10 s on 2 cores)."""
    from pyllm_a100 import Server

    server = Server(tiny_models[request.param], port=0, ready_timeout=300, parallel=2).start()
    try:
        yield request.param, server
    finally:
        server.stop()


def responses_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0, timeout=300)


def messages(server, body: dict, stream: bool = False) -> httpx.Response | list[dict]:
    """POST /v1/messages; a stream comes back as its list of events (an error event fails the test)."""
    body = {"model": "m", "max_tokens": MAX_CALL_TOKENS, **body}
    url = server.base_url + "/v1/messages"
    if not stream:
        return httpx.post(url, json=body, timeout=300)
    events = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert not [e for e in events if e.get("type") == "error"], events
    return events


def function_calls(response) -> list:
    return [item for item in response.output if item.type == "function_call"]


@pytest.mark.parametrize("choice, named", [("required", None), ({"type": "function", "name": "get_time"}, "get_time")])
def test_responses_forced_call_then_tool_result(served, choice, named) -> None:
    name, server = served
    api = responses_client(server)
    ask = [{"role": "user", "content": QUESTION}]
    r = api.responses.create(model="m", input=ask, tools=RESPONSES_TOOLS, tool_choice=choice, parallel_tool_calls=False,
                             max_output_tokens=MAX_CALL_TOKENS, temperature=1.0, extra_body={"seed": 1, **thinking_off(name)})
    assert r.status == "completed"
    (call,) = function_calls(r)
    assert call.call_id and (named is None or call.name == named)
    args = check_call(call.name, call.arguments, TOOLS)
    # the tool result turn: the reply's items go back as input, then the function's output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"city": args["city"], "ok": True})}
    after = api.responses.create(model="m", input=ask + [item.model_dump(exclude_none=True) for item in r.output] + [result],
                                 tools=RESPONSES_TOOLS, tool_choice="auto", max_output_tokens=8, temperature=0.8,
                                 extra_body={"seed": 2, **thinking_off(name)})
    assert after.status == "completed" and after.usage.input_tokens > r.usage.input_tokens


def test_responses_auto_is_always_answered_never_a_500(served) -> None:
    """Noise under "auto", streamed and not, thinking on and off: a reply every time (a 500 raises here)."""
    name, server = served
    api = responses_client(server)
    key = chat_format(preset(name).family).thinking_key
    rng = random.Random(7)
    for i in range(8):
        body = dict(model="m", input=QUESTION, tools=RESPONSES_TOOLS if i % 2 else RESPONSES_TOOLS[:1], tool_choice="auto",
                    max_output_tokens=rng.randint(1, 48), temperature=round(rng.uniform(0, 1.5), 2),
                    extra_body={"seed": rng.randrange(2**31), "chat_template_kwargs": {key: i % 3 != 0}})
        if i % 2:
            events = list(api.responses.create(**body, stream=True))
            assert events[-1].type == "response.completed", events[-1]
            r = events[-1].response
        else:
            r = api.responses.create(**body)
        assert r.status == "completed"
        for call in function_calls(r):
            check_call(call.name, call.arguments, TOOLS)


def test_responses_named_function_not_in_tools_is_a_400(served) -> None:
    _, server = served
    with pytest.raises(openai.BadRequestError, match="get_stock_price"):
        responses_client(server).responses.create(model="m", input="Hi", tools=RESPONSES_TOOLS, max_output_tokens=4,
                                                  tool_choice={"type": "function", "name": "get_stock_price"})


def tool_uses(reply: dict) -> list[dict]:
    return [block for block in reply["content"] if block["type"] == "tool_use"]


@pytest.mark.parametrize("choice, named", [({"type": "any"}, None), ({"type": "tool", "name": "get_time"}, "get_time"),
                                           ({"type": "tool", "name": "get_weather"}, "get_weather")])
def test_messages_forced_call_then_tool_result(served, choice, named) -> None:
    name, server = served
    ask = [{"role": "user", "content": QUESTION}]
    r = messages(server, {"messages": ask, "tools": MESSAGES_TOOLS, "temperature": 1.0, "seed": 1, **thinking_off(name),
                          "tool_choice": {**choice, "disable_parallel_tool_use": True}})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["stop_reason"] == "tool_use", reply
    (use,) = tool_uses(reply)
    assert use["id"] and (named is None or use["name"] == named), use
    check_call(use["name"], json.dumps(use["input"]), TOOLS)
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                           "content": json.dumps({"city": use["input"]["city"], "ok": True})}]}
    after = messages(server, {"messages": ask + [{"role": "assistant", "content": reply["content"]}, result],
                              "tools": MESSAGES_TOOLS, "max_tokens": 8, **thinking_off(name)})
    assert after.status_code == 200, after.text
    # Anthropic's input_tokens leaves out what came from the prompt cache (the slot kept the first turn)
    prompt_tokens = lambda usage: usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)  # noqa: E731
    assert prompt_tokens(after.json()["usage"]) > prompt_tokens(reply["usage"]) + len(reply["content"])


def test_anthropic_sdk_agent_turn(served) -> None:
    """What a Claude-style agent sends, through Anthropic's own SDK: a named call, its tool_result, the next turn."""
    name, server = served
    # llama-server closes the connection after a streamed reply without a "Connection: close" header; a pooled
    # connection reused at once then fails ("Server disconnected", seen once in CI). The SDK's default retries hide
    # that; with retries off here, one connection per request (README, "Tool calls and reasoning")
    client = anthropic.Anthropic(base_url=server.base_url, api_key="none", max_retries=0, timeout=300,
                                 default_headers={"Connection": "close"})
    extra = {"temperature": 1.0, **thinking_off(name)}
    ask = [{"role": "user", "content": QUESTION}]
    first = client.messages.create(model="m", max_tokens=MAX_CALL_TOKENS, messages=ask, tools=MESSAGES_TOOLS, extra_body=extra,
                                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "get_weather", first
    check_call(use.name, json.dumps(use.input), TOOLS)
    turn = ask + [{"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "12 C, sunny"}]}]
    with client.messages.stream(model="m", max_tokens=8, messages=turn, tools=MESSAGES_TOOLS, extra_body=extra) as stream:
        second = stream.get_final_message()
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content, second
    with pytest.raises(anthropic.BadRequestError, match="get_stock_price"):
        client.messages.create(model="m", max_tokens=4, messages=ask, tools=MESSAGES_TOOLS,
                               tool_choice={"type": "tool", "name": "get_stock_price"})


def test_messages_seed_reproduces_a_sampled_call(served) -> None:
    """A seeded request sampled at temperature 1 gives the same call twice (patch 0014: the seed was dropped)."""
    name, server = served
    body = {"messages": [{"role": "user", "content": QUESTION}], "tools": MESSAGES_TOOLS, "temperature": 1.0, "seed": 5,
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, **thinking_off(name)}
    first, second = (messages(server, body).json() for _ in range(2))
    assert tool_uses(first) and [u["input"] for u in tool_uses(first)] == [u["input"] for u in tool_uses(second)], (first, second)


@pytest.mark.parametrize("parallel", [False, True])
def test_messages_forced_call_streamed(served, parallel) -> None:
    """A named tool, streamed: one call with disable_parallel_tool_use, else one or more calls, all of that tool (a random
    model may go on calling until max_tokens cuts the last call: every call before it is whole)."""
    name, server = served
    choice = {"type": "tool", "name": "get_time", **({} if parallel else {"disable_parallel_tool_use": True})}
    events = messages(server, {"messages": [{"role": "user", "content": QUESTION}], "tools": MESSAGES_TOOLS,
                               "temperature": 1.0, "seed": 2, "tool_choice": choice, **thinking_off(name)}, stream=True)
    starts = [(i, e["index"]) for i, e in enumerate(events) if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    names = [events[i]["content_block"]["name"] for i, _ in starts]
    assert names == ["get_time"] or (parallel and names and set(names) == {"get_time"}), events
    (stop,) = [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"]
    assert stop == "tool_use" or (parallel and stop == "max_tokens" and len(starts) > 1), events
    whole = starts if stop == "tool_use" else starts[:-1]
    for _, index in whole:  # each block's argument deltas assemble into a valid call
        args = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                       and e["index"] == index and e["delta"]["type"] == "input_json_delta")
        check_call("get_time", args, TOOLS)


def test_messages_auto_and_none_are_always_answered(served) -> None:
    """Noise under "auto" is a reply every time (streamed and not); "none" never gives a tool_use block."""
    name, server = served
    key = chat_format(preset(name).family).thinking_key
    rng = random.Random(11)
    for i in range(8):
        choice = {"type": "none"} if i % 4 == 3 else {"type": "auto"}
        body = {"messages": [{"role": "user", "content": QUESTION}], "tools": MESSAGES_TOOLS if i % 2 else MESSAGES_TOOLS[:1],
                "tool_choice": choice, "max_tokens": rng.randint(1, 48), "temperature": round(rng.uniform(0, 1.5), 2),
                "chat_template_kwargs": {key: i % 3 != 0}}
        if i % 2:
            events = messages(server, body, stream=True)
            assert events[-1]["type"] == "message_stop", events[-1]
            uses = [e for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
        else:
            r = messages(server, body)
            assert r.status_code == 200, r.text
            uses = tool_uses(r.json())
            for use in uses:
                check_call(use["name"], json.dumps(use["input"]), TOOLS)
        assert not (choice["type"] == "none" and uses), (body, uses)


@pytest.mark.parametrize("choice, message", [({"type": "tool", "name": "get_stock_price"}, "get_stock_price"),
                                              ({"type": "sometimes"}, "sometimes")])
def test_messages_bad_tool_choice_is_a_400(served, choice, message) -> None:
    _, server = served
    r = messages(server, {"messages": [{"role": "user", "content": "Hi"}], "tools": MESSAGES_TOOLS, "max_tokens": 4,
                          "tool_choice": choice})
    assert r.status_code == 400 and message in r.text, r.text

