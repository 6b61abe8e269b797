"""Tool calls and reasoning through the OpenAI client, on random-weight DeepSeek-V4 and GLM-5 models.

Random weights write noise, so these check the server's side of the contract: unparseable output is
a reply (HTTP 200, the text as content), never an HTTP 500 (vendor/patches/0007); tool_choice
"required" and a named function give a call that parses against the tools' schemas, streamed and
not (0008, 0009); an agent loop (call, tool result, next turn) renders in each family's own template.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from pyllm_a100.synth import synthesize
from pyllm_a100.synth.chat import CHAT_FORMATS, chat_format
from pyllm_a100.synth.presets import preset

# Random weights: a string with no bound is text until the closing tag, which such a model rarely
# writes; enum, maxLength and integers are what the grammar can hold to (patch 0009 keeps them).
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }, "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                                                    "utc_offset": {"type": "integer"}},
                   "required": ["city", "utc_offset"]}}}
TOOLS = [WEATHER, TIME]
# The synthetic vocabulary spells DSML markup mostly a character a token: one call is ~150-250 tokens.
# One call per reply (parallel_tool_calls=False): random weights would add calls up to max_tokens.
MAX_CALL_TOKENS = 600

# Switching thinking off, as each family's template reads it (synth/chat.py; README: Tool calls and reasoning;
# test_thinking_switches_are_the_templates_own checks them against the templates).
THINKING_OFF = {p: chat_format(preset(p).family).thinking(False) for p in ("tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32")}


def client(server) -> OpenAI:
    return OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0, timeout=300)


def assemble(stream) -> tuple[dict, str | None]:
    """A streamed reply put together as a client does: content, reasoning, tool calls by index."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = tc.id or call["id"]
            if tc.function is not None:
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "tool_calls": [calls[i] for i in sorted(calls)]}, finish


def wait_for_log(server, text: str, timeout: float = 10) -> bool:
    """llama-server's log is written by a thread of its own: a line can land after the reply."""
    deadline = time.monotonic() + timeout
    while text not in server.log_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def check_call(name: str, arguments: str, tools: list[dict]) -> dict:
    """The call names one of ``tools`` and its arguments are a JSON object that keeps the schema."""
    (tool,) = [t["function"] for t in tools if t["function"]["name"] == name]
    args = json.loads(arguments)
    schema = tool["parameters"]
    assert isinstance(args, dict) and set(schema["required"]) <= set(args) <= set(schema["properties"]), (name, args)
    for key, value in args.items():
        prop = schema["properties"][key]
        if prop["type"] == "integer":
            assert isinstance(value, int), (key, value)
        else:
            assert isinstance(value, str), (key, value)
            # the grammar counts characters; a malformed byte sequence it let through (one character
            # to it) comes back as up to four U+FFFD (patch 0012), which are not counted here
            chars = len(value) - value.count("\ufffd")
            assert value in prop.get("enum", [value]) and chars <= prop.get("maxLength", chars), (key, value)
    return args


@pytest.fixture(scope="module")
def seed3_deepseek4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model of the report (pyllm synth tiny-deepseek4 --seed 3)."""
    return synthesize("tiny-deepseek4", tmp_path_factory.mktemp("seed3") / "tiny-deepseek4-s3.gguf", seed=3).first


def test_tool_choice_auto_is_always_answered_never_a_500(servers, tiny_models: dict[str, Path], seed3_deepseek4: Path) -> None:
    """Sampled noise often looks like broken markup; the reply is then the text as content, with a warning in the log."""
    rng = random.Random(24)
    key = {p: chat_format(preset(p).family).thinking_key for p in ("tiny-deepseek4", "tiny-glm-dsa")}
    switch = {tiny_models["tiny-deepseek4"]: key["tiny-deepseek4"], seed3_deepseek4: key["tiny-deepseek4"],
              tiny_models["tiny-glm-dsa"]: key["tiny-glm-dsa"]}
    for model in (tiny_models["tiny-deepseek4"], seed3_deepseek4, tiny_models["tiny-glm-dsa"]):
        server = servers.start(model)  # --parallel 4 --kv-unified: the 2-tool V4 prompt is over 1024 tokens
        api = client(server)
        cases = [dict(seed=rng.randrange(2**31), max_tokens=rng.randint(1, 64), temperature=round(rng.uniform(0, 1.5), 2),
                      stream=i % 2 == 1, thinking=i % 3 != 0, tools=TOOLS if i % 4 else [WEATHER]) for i in range(32)]

        def ask(case: dict) -> tuple[dict, str | None, int]:
            body = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=case["tools"],
                        tool_choice="auto", max_tokens=case["max_tokens"], temperature=case["temperature"], seed=case["seed"],
                        extra_body={"chat_template_kwargs": {switch[model]: case["thinking"]}})
            if case["stream"]:
                reply, finish = assemble(api.chat.completions.create(**body, stream=True))
                return reply, finish, -1
            r = api.chat.completions.create(**body)
            msg = r.choices[0].message
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []]
            return ({"content": msg.content or "", "reasoning": getattr(msg, "reasoning_content", None) or "",
                     "tool_calls": calls}, r.choices[0].finish_reason, r.usage.completion_tokens)

        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(ask, cases))  # an HTTP 500 raises openai.InternalServerError here
        for case, (reply, finish, tokens) in zip(cases, replies):
            assert finish in ("stop", "length", "tool_calls"), (case, finish)
            assert (finish == "tool_calls") == bool(reply["tool_calls"]) or finish == "length", (case, reply, finish)
            if finish == "tool_calls":
                for call in reply["tool_calls"]:
                    check_call(call["name"], call["arguments"], case["tools"])
            if tokens > 0 and not reply["tool_calls"]:
                assert reply["content"] or reply["reasoning"], (case, reply)
        if model == seed3_deepseek4:
            assert wait_for_log(server, "returning the model's output as content"), "the report's model no longer " \
                "writes unparseable output: this test would not see the fallback"


@pytest.mark.parametrize("stream", [False, True])
def test_output_that_does_not_parse_is_the_reply_with_a_warning(servers, tiny_deepseek4: Path, stream: bool) -> None:
    """Thinking off, then the model opens <think> anyway (forced with logit_bias): at the pin an HTTP 500 (or an
    error event); now HTTP 200, the text as it was (reasoning it opened), finish_reason as usual, one warning."""
    from pyllm_a100.synth.vocab import build_vocab

    think = build_vocab(1024).tokens.index("<think>")
    server = servers.start(tiny_deepseek4)
    body = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS,
                tool_choice="auto", max_tokens=6, temperature=0, logit_bias={str(think): 100},
                extra_body={"chat_template_kwargs": {"thinking": False}})
    api = client(server)
    if stream:
        reply, finish = assemble(api.chat.completions.create(**body, stream=True))
    else:
        r = api.chat.completions.create(**body)
        msg, finish = r.choices[0].message, r.choices[0].finish_reason
        reply = {"content": msg.content or "", "reasoning": getattr(msg, "reasoning_content", None) or "",
                 "tool_calls": msg.tool_calls or []}
    assert finish == "length" and not reply["tool_calls"]
    assert reply["content"] + reply["reasoning"] == "<think>" * 5, reply  # the first <think> opened the reasoning
    assert wait_for_log(server, "returning the model's output as content")


@pytest.mark.parametrize("preset", ["tiny-deepseek4", "tiny-glm-dsa", "tiny-deepseek32"])
def test_required_and_named_function_give_a_call_that_parses(servers, tiny_models: dict[str, Path], preset: str) -> None:
    server = servers.start(tiny_models[preset], parallel=2)
    api = client(server)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choices = [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
               ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")]
    for tool_choice, named in choices:
        for seed in (1, 2):  # 3 presets x 3 choices x 2 seeds x plain+streamed: ~3 min on a loaded 2-core box
            body = dict(model="m", messages=messages, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=MAX_CALL_TOKENS, temperature=1.0,
                        seed=seed, extra_body={"chat_template_kwargs": THINKING_OFF[preset]})
            r = api.chat.completions.create(**body)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls, (tool_choice, seed, msg)
            for call in msg.tool_calls:
                assert named is None or call.function.name == named
                check_call(call.function.name, call.function.arguments, TOOLS)
                assert call.id
            streamed, finish = assemble(api.chat.completions.create(**body, stream=True))
            assert finish == "tool_calls" and streamed["tool_calls"], (tool_choice, seed, streamed)
            for call in streamed["tool_calls"]:
                assert named is None or call["name"] == named
                check_call(call["name"], call["arguments"], TOOLS)
                assert call["id"]


HI = [{"role": "user", "content": "Hi"}]
BAD_CALL_HISTORY = HI + [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
    "name": "get_weather", "arguments": "{city: Paris"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
# Requests the server cannot act on, and the words its 400 must hold (at the pin the middle three were HTTP 500s and
# "required" with no tools was free text under 200, a blank or repeated tool name answered with a call named "" or
# text: vendor/patches/0008 and 0017)
BAD_REQUESTS = {
    "named-function-not-in-tools": (dict(messages=HI, tools=[WEATHER], tool_choice={
        "type": "function", "function": {"name": "get_stock_price"}}), "get_stock_price"),
    "tools-not-a-list": (dict(messages=HI, tools={"a": 1}), "Failed to parse tools"),
    "tool-without-function": (dict(messages=HI, tools=[{"type": "function"}]), "Missing tool function"),
    "history-arguments-not-json": (dict(messages=BAD_CALL_HISTORY, tools=[WEATHER]), "arguments as JSON"),
    "required-with-empty-tools": (dict(messages=HI, tools=[], tool_choice="required"), "at least one tool"),
    "required-without-tools": (dict(messages=HI, tool_choice="required"), "at least one tool"),
    "tool-with-empty-name": (dict(messages=HI, tools=[dict(WEATHER, function=dict(WEATHER["function"], name=""))]), "no name"),
    "tool-with-blank-name": (dict(messages=HI, tools=[dict(WEATHER, function=dict(WEATHER["function"], name=" "))]), "no name"),
    "two-tools-of-one-name": (dict(messages=HI, tools=[WEATHER, dict(TIME, function=dict(TIME["function"], name="get_weather"))]),
                              'two functions are named "get_weather"'),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_request_the_server_cannot_act_on_is_a_400_that_says_why(servers, tiny_deepseek4: Path, case: str) -> None:
    server = servers.start(tiny_deepseek4)
    body, words = BAD_REQUESTS[case]
    r = httpx.post(server.openai_base_url + "/chat/completions", timeout=60, json=dict(body, max_tokens=4))
    assert r.status_code == 400 and words in r.json()["error"]["message"], (r.status_code, r.text[:500])
    assert server.healthy()  # and still serving


def test_required_over_a_json_typed_argument_is_always_a_call(servers, tmp_path: Path) -> None:
    """A {} schema lets the grammar write any JSON, malformed UTF-8 inside its strings included (the grammar decodes
    bytes leniently). At the pin such a call did not parse and "required" came back as text: 9 of these 20 seeds on
    this model ended "stop" with no tool_calls; with vendor/patches/0019 the bytes are U+FFFD and every one is a call."""
    model = synthesize("tiny-deepseek4", tmp_path / "tiny-deepseek4-s42.gguf", seed=42).first
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {}}, "required": ["x"]}}}]
    api = client(servers.start(model))
    for seed in range(20):
        r = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                        tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=400,
                                        temperature=1.0, seed=seed, extra_body={"chat_template_kwargs": THINKING_OFF["tiny-deepseek4"]})
        choice = r.choices[0]
        assert choice.message.tool_calls, (seed, choice)  # "length" too: the call so far, never text instead of a call
        if choice.finish_reason == "tool_calls":
            (call,) = choice.message.tool_calls
            assert call.function.name == "f" and set(json.loads(call.function.arguments)) == {"x"}, (seed, call)


TOOL_RESULT_MARKUP = {"tiny-deepseek4": "<tool_result>", "tiny-glm-dsa": "<tool_response>"}


@pytest.mark.parametrize("preset", ["tiny-deepseek4", "tiny-glm-dsa"])
def test_agent_loop_call_result_next_turn(servers, tiny_models: dict[str, Path], preset: str) -> None:
    """user -> tool call -> tool result -> next turn -> another call -> result -> an answer, history kept."""
    server = servers.start(tiny_models[preset])
    api = client(server)
    kwargs = {"chat_template_kwargs": THINKING_OFF[preset]}
    messages: list[dict] = [{"role": "system", "content": "You are a weather assistant."},
                            {"role": "user", "content": "What is the weather in Paris, and the time in Tokyo?"}]
    prompt_tokens = []
    for turn, choice in enumerate(["required", {"type": "function", "function": {"name": "get_time"}}]):
        r = api.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=MAX_CALL_TOKENS,
                                        temperature=0.8, seed=turn, extra_body=kwargs)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
        prompt_tokens.append(r.usage.prompt_tokens)
        messages.append(msg.model_dump(exclude_none=True))  # the assistant turn as the client got it
        for call in msg.tool_calls:
            args = check_call(call.function.name, call.function.arguments, TOOLS)
            result = {"city": args["city"], "temperature": 21, "unit": args.get("unit", "celsius")} \
                if call.function.name == "get_weather" else {"city": args["city"], "time": "14:05"}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = api.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=16,
                                        temperature=0.8, seed=7, extra_body=kwargs)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert prompt_tokens[0] < prompt_tokens[1] < final.usage.prompt_tokens
    # the history as the family's template renders it: the calls and their results, in its own markup
    rendered = httpx.post(server.base_url + "/apply-template", timeout=60,
                          json={"messages": messages, "tools": TOOLS, **kwargs}).json()["prompt"]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert rendered.count(TOOL_RESULT_MARKUP[preset]) == len(results) and all(r in rendered for r in results)
    if preset == "tiny-glm-dsa":
        assert "[gMASK]<sop>" in rendered and "<tool_call>" in rendered and "<|observation|>" in rendered
    else:
        assert "<｜DSML｜tool_calls>" in rendered and "<｜DSML｜invoke name=" in rendered


CASES = sorted((Path(__file__).parent / "data" / "chat-outputs").glob("*.json"))
REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "vendor" / "llama.cpp"


@pytest.fixture(scope="module")
def chat_parse_check(native_dir: Path, info: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lab/scripts/chat-parse-check.cpp built against the installed libllama-common (the pin's chat code, our patches)."""
    import shutil
    import subprocess

    # the tree the installed build was compiled from (an archive build on the GPU machine), else vendor/llama.cpp
    tree = next((t for t in (Path(info.get("source_tree") or "/nonexistent"), TREE) if (t / "common" / "chat.h").is_file()), None)
    if shutil.which("g++") is None or tree is None:
        pytest.skip("needs g++ and the llama.cpp tree the build used (build-info source_tree, or vendor/llama.cpp)")
    exe = tmp_path_factory.mktemp("chat-check") / "chat-parse-check"
    include = [f"-I{tree / d}" for d in ("common", "include", "ggml/include", "vendor")]
    subprocess.run(["g++", "-O1", "-std=c++17", *include, "-o", str(exe), str(REPO / "lab" / "scripts" / "chat-parse-check.cpp"),
                    f"-L{native_dir}", "-lllama-common", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{native_dir}"],
                   check=True, capture_output=True, timeout=300)
    return exe


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_outputs_parse_through_the_pins_chat_code(chat_parse_check: Path, native_dir: Path, case: Path, tmp_path: Path) -> None:
    """Each family's markup, as the real models write it, parsed by the pin's own common_chat_parse with the
    template the synthetic presets embed (from the native dir, as pyllm synth reads it). Cases with a "source"
    are other parsers' test outputs (vLLM's deepseek_v4 and glm47), with what those parsers return."""
    import subprocess

    data = json.loads(case.read_text())
    (tmp_path / "request.json").write_text(json.dumps(data["request"]))
    (tmp_path / "output.txt").write_text(data["output"])
    run = subprocess.run([str(chat_parse_check), str(native_dir / "templates" / data["template"]), str(tmp_path / "request.json"),
                          str(tmp_path / "output.txt")], capture_output=True, text=True, timeout=60)
    got = json.loads(run.stdout)
    # "expect" is what the case's source parser returns; "pin" (with its "note") what the pin does where it differs
    expect = data.get("pin", data["expect"])
    if expect.get("error"):
        assert run.returncode == 1 and "does not match" in got["error"]
        return
    assert run.returncode == 0, got
    msg = got["message"]
    assert (msg.get("content") or "") == expect["content"]
    assert (msg.get("reasoning_content") or "") == expect.get("reasoning_content", "")
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in msg.get("tool_calls", [])]
    assert calls == expect["tool_calls"]


@pytest.mark.parametrize("family", sorted(CHAT_FORMATS))
def test_thinking_switches_are_the_templates_own(chat_parse_check: Path, native_dir: Path, family: str, tmp_path: Path) -> None:
    """synth/chat.py's switches (the README's thinking table, the compat column) against each template, as the pin
    renders it: the generation prompt opens reasoning by default and with the switch on, closes it with the switch
    off, and with the fallback key alone where chat.py names one."""
    import subprocess

    fmt = CHAT_FORMATS[family]
    (tmp_path / "output.txt").write_text("")

    def prompt(kwargs: dict) -> str:
        (tmp_path / "request.json").write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                                           "chat_template_kwargs": kwargs}))
        run = subprocess.run([str(chat_parse_check), str(native_dir / "templates" / fmt.template), str(tmp_path / "request.json"),
                              str(tmp_path / "output.txt")], capture_output=True, text=True, timeout=60)
        return json.loads(run.stdout)["generation_prompt"]

    assert prompt({}).endswith("<think>") and prompt(fmt.thinking(True)).endswith("<think>")
    assert prompt(fmt.thinking(False)).endswith("</think>")
    if fmt.thinking_fallback:
        assert prompt({fmt.thinking_fallback: False}).endswith("</think>")
    wrong = "thinking" if fmt.thinking_key == "enable_thinking" and not fmt.thinking_fallback else None
    if wrong:  # a key the template does not read leaves thinking on
        assert prompt({wrong: False}).endswith("<think>")
