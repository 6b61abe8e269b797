// Checks vendor/patches/0003: the hand-written DeepSeek-V3 pre-tokenizer splitters give the same
// words as the std::regex path they replace, and long runs no longer recurse.
//
//   g++ -O1 -std=c++17 -I vendor/llama.cpp/src -o /tmp/pretokenizer-check \
//       lab/scripts/pretokenizer-check.cpp vendor/llama.cpp/src/unicode-data.cpp
//   /tmp/pretokenizer-check 300000        # random texts; exit 1 on any mismatch
//
// The std::regex side runs the same regexes wrapped in "(?:...)": equal in meaning, but not the
// strings unicode.cpp dispatches to its custom splitters.
#include "unicode.cpp"
#include <cstdio>
#include <random>

static const std::vector<std::string> DS3 = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

int main(int argc, char ** argv) {
    std::vector<std::string> wrapped;
    for (const auto & e : DS3) wrapped.push_back(e == DS3[0] ? e : "(?:" + e + ")");  // not the dispatch string: std::regex
    const std::vector<uint32_t> alphabet = {
        'a', 'b', 'Z', 'q', '0', '7', '9', ' ', ' ', ' ', '\t', '\n', '\r', '\v', '\f', 0x1C, 0x00, 0x01, 0x7F,
        '!', '"', '#', '$', '%', '&', '\'', '(', '*', '+', ',', '-', '.', '/', ':', ';', '<', '=', '>', '?', '@',
        '[', '\\', ']', '^', '_', '`', '{', '|', '}', '~',
        0xE9, 0xDF, 0x3B1, 0x416, 0x5D0, 0x627,            // letters: é ß α Ж א ا
        0x301, 0x308, 0x64B, 0x903,                          // marks
        0xB2, 0xBD, 0x663, 0x2163, 0xFF11,                  // numbers: ² ½ ٣ Ⅳ １
        0xA0, 0x3000, 0x2028, 0x85, 0x2003,                  // non-ASCII whitespace
        0x3002, 0xFF0C, 0x2014, 0xA1, 0xBF, 0x300C,         // punctuation
        0x20AC, 0xA9, 0x2192, 0x1F642, 0x1F680, 0xFF04,     // symbols
        0x4E00, 0x4F60, 0x9FA5, 0x9FA6, 0x3041, 0x3093, 0x30A2, 0x30FC, 0x30FF, 0x3040, 0xAC00, 0x3400,  // CJK, kana, hangul, edges
        0x200B, 0x200D, 0xFEFF, 0xE000, 0x378,              // format, private use, unassigned
    };
    const int n = argc > 1 ? atoi(argv[1]) : 100000;
    std::mt19937 rng(1234);
    int bad = 0;
    for (int it = 0; it < n; ++it) {
        const int len = rng() % 40;
        std::string text;
        uint32_t prev = 'a';
        for (int i = 0; i < len; ++i) {
            uint32_t c = (rng() % 3 == 0) ? prev : alphabet[rng() % alphabet.size()];  // runs too
            text += unicode_cpt_to_utf8(c);
            prev = c;
        }
        const auto a = unicode_regex_split(text, DS3);
        const auto b = unicode_regex_split(text, wrapped);
        if (a != b) {
            if (++bad <= 10) {
                printf("MISMATCH len %d:", len);
                for (auto c : unicode_cpts_from_utf8(text)) printf(" %X", c);
                printf("\n  custom:");
                for (auto & w : a) printf(" [%s]", w.c_str());
                printf("\n  regex: ");
                for (auto & w : b) printf(" [%s]", w.c_str());
                printf("\n");
            }
        }
    }
    printf("%d random texts, %d mismatches\n", n, bad);
    // long runs: std::regex overflowed the stack here
    for (uint32_t c : {(uint32_t) 'a', (uint32_t) ' ', (uint32_t) '!', (uint32_t) '\n', 0x4E00u, 0xE9u, 0x301u, 0x3002u, (uint32_t) '7'}) {
        std::string text;
        for (int i = 0; i < 200000; ++i) text += unicode_cpt_to_utf8(c);
        const auto w = unicode_regex_split(text, DS3);
        printf("run of 200000 x U+%04X: %zu words\n", c, w.size());
    }
    return bad != 0;
}
