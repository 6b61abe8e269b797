"""The chat template each family's presets embed, and what it means for tool calls and reasoning.

One source for `pyllm synth` (the template a GGUF carries), the README's "tool calls / reasoning" column
and docs/serving.md's table of thinking switches (rendered from here), and tests/test_tools.py (the
kwargs that switch thinking, checked there against the templates' own generation prompts). Plain
data with no package imports: the renderer loads this file by path, with or without a build.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    template: str  # a file of the pinned tree's models/templates/ (installed into the native dir)
    models: str  # the real models that write this markup, as the README names them
    tool_calls: str  # the tool-call markup, short
    parser: str  # which of the pin's chat parsers reads it (common/chat.cpp picks it from the template)
    thinking_key: str  # the chat_template_kwargs key the template reads first
    thinking_fallback: str | None  # read when thinking_key is absent (llama-server always sets enable_thinking)

    def thinking(self, on: bool) -> dict[str, bool]:
        """The chat_template_kwargs that switch thinking on or off for this template."""
        return {self.thinking_key: on}

    def switches(self) -> str:
        """How a request switches thinking, for the README."""
        off = f'`{{"{self.thinking_key}": false}}`'
        if self.thinking_fallback:
            off += f' (or `{{"{self.thinking_fallback}": false}}`)'
        return off


DSML_PARSER = "the pin's DSML parser, common/parsers/deepseek.cpp"
# Families with a chat model of their own; a draft family (deepseek4-mtp) takes its target's.
CHAT_FORMATS = {
    "deepseek4": ChatFormat(
        "deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "DeepSeek-V4", "DSML `<｜DSML｜tool_calls>` blocks",
        DSML_PARSER, "thinking", "enable_thinking"),
    "deepseek32": ChatFormat(
        "deepseek-ai-DeepSeek-V3.2.jinja", "DeepSeek-V3.2", "DSML `<｜DSML｜function_calls>` blocks",
        DSML_PARSER, "thinking", "enable_thinking"),
    "glm-dsa": ChatFormat(
        "GLM-4.7-Flash.jinja", "GLM-5, GLM-4.7", "`<tool_call>NAME<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>`",
        "the pin's autoparser, common/chat-auto-parser*.cpp", "enable_thinking", None),
}
# Presets with no chat model of their own (tiny-llama, tiny-mamba: DeepSeek's vocabulary) embed this one.
DEFAULT_TEMPLATE = "deepseek-ai-DeepSeek-V4.jinja"


def chat_format(family: str) -> ChatFormat | None:
    """The chat format of a preset family (``deepseek4-mtp`` is ``deepseek4``'s); None: no chat model of its own."""
    for prefix, fmt in CHAT_FORMATS.items():
        if family == prefix or family.startswith(prefix + "-"):
            return fmt
    return None


def chat_template_name(family: str) -> str:
    """The template file a preset of ``family`` embeds."""
    fmt = chat_format(family)
    return fmt.template if fmt else DEFAULT_TEMPLATE
