// Parses a model's raw output through the pinned llama.cpp's own chat code, as llama-server does:
// the template applied to a request (chat format, generation prompt, grammar), then
// common_chat_parse of the text. For recorded real outputs (tests/data/chat-outputs/) and for
// debugging what a random-weight model wrote (a server log's "unparsed ... output").
//
//   B=build/cp311-cp311-linux_x86_64; T=vendor/llama.cpp
//   g++ -O1 -std=c++17 -I $T/common -I $T/include -I $T/ggml/include -I $T/vendor \
//       -o /tmp/chat-parse-check lab/scripts/chat-parse-check.cpp \
//       -L $B/bin -lllama-common -lllama -lggml -lggml-base -Wl,-rpath,$PWD/$B/bin
//   /tmp/chat-parse-check TEMPLATE.jinja REQUEST.json OUTPUT.txt [--grammar]
//
// REQUEST.json: {"messages": [...], "tools": [...], "tool_choice": "auto" | "required" | "none",
// "chat_template_kwargs": {...}, "parallel_tool_calls": false, "reasoning_format": "auto"}
// (enable_thinking follows chat_template_kwargs.enable_thinking, as in llama-server; default true).
// Prints one JSON object: format, generation_prompt, grammar_lazy, the parsed message as the
// OpenAI API returns it (or "error": the parse exception's text, which llama-server at the pin
// turned into HTTP 500); exit 0 when it parsed, 1 when it did not, 2 on bad arguments.
#include "chat.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

static std::string read_file(const char * path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TEMPLATE.jinja REQUEST.json OUTPUT.txt [--grammar]\n", argv[0]);
        return 2;
    }
    const bool show_grammar = argc > 4 && std::string(argv[4]) == "--grammar";
    auto tmpls = common_chat_templates_init(nullptr, read_file(argv[1]));
    const auto request = common_json::parse(read_file(argv[2]));
    const std::string output = read_file(argv[3]);

    common_chat_templates_inputs inputs;
    inputs.use_jinja = true;
    inputs.messages = common_chat_msgs_parse_oaicompat(request.at("messages"));
    if (request.contains("tools")) {
        inputs.tools = common_chat_tools_parse_oaicompat(request.at("tools"));
    }
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(request.value("tool_choice", std::string("auto")));
    inputs.parallel_tool_calls = request.value("parallel_tool_calls", false);
    inputs.reasoning_format = common_reasoning_format_from_name(request.value("reasoning_format", std::string("auto")));
    inputs.enable_thinking = true;
    const common_json kwargs = request.value("chat_template_kwargs", common_json::object());
    for (const auto & [k, v] : kwargs.items()) {
        inputs.chat_template_kwargs[k] = v.dump();
        if (k == "enable_thinking" && v.is_boolean()) {
            inputs.enable_thinking = v.get<bool>();
        }
    }
    const auto params = common_chat_templates_apply(tmpls.get(), inputs);

    common_chat_parser_params pp(params);
    pp.reasoning_format = inputs.reasoning_format;
    pp.parser.load(params.parser);

    common_json out = {
        {"format", common_chat_format_name(params.format)},
        {"generation_prompt", params.generation_prompt},
        {"grammar_lazy", params.grammar_lazy},
    };
    if (show_grammar) {
        out["grammar"] = params.grammar;
    }
    int rc = 0;
    try {
        const auto msg = common_chat_parse(output, /* is_partial = */ false, pp);
        out["message"] = common_chat_msgs_to_json_oaicompat({ msg }).at(0);
    } catch (const std::exception & e) {
        out["error"] = e.what();
        rc = 1;
    }
    std::cout << out.dump(2) << std::endl;
    return rc;
}
