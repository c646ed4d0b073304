#!/usr/bin/env python3
"""Builds the differential corpus that tests/tokenizer checks kite against, using Hugging Face tokenizers.

Usage (on a machine with `tokenizers` installed; kite's tests need no Python):
    python3 tests/tokenizer/make_corpus.py --tokenizer tests/data/tokenizer/tokenizer.json \
        --out tests/data/tokenizer/corpus-qwen3.jsonl --probe-out tests/data/tokenizer/codepoints-qwen3.txt

corpus-qwen3.jsonl: one JSON object a line:
    {"category": "...", "text": "..."} or, for byte strings that are not valid UTF-8, {"hex": "..."};
    "ids": Tokenizer.encode(text, add_special_tokens=False).ids, where invalid UTF-8 is first decoded with
    errors="replace" (the behaviour kite documents); "decoded": Tokenizer.decode(ids, skip_special_tokens=False).
codepoints-qwen3.txt: for every Unicode scalar value c, the normalizer and pre-tokenizer result of a probe
    string built around c (see probe_text), as run-length ranges "first last signature". It pins down the
    Unicode tables (NFC, \\p{L}, \\p{N}, \\s, case folding) kite's libraries use against Hugging Face's.

The generation is deterministic (fixed seed, texts written below); only `tokenizers` is needed.
"""
import argparse
import json
import random
import sys
import unicodedata

SEED = 20251130

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Call me Ishmael. Some years ago - never mind how long precisely - I thought I would sail about a little.",
    "In the beginning the Universe was created. This has made a lot of people very angry.",
    "She sells sea shells by the sea shore; the shells she sells are surely seashells.",
    "A tokenizer turns text into integers, and a detokenizer turns them back again.",
    "The committee met on Tuesday (after a two-week delay) to discuss the budget for 2024-2025.",
    "\"Why,\" she asked, \"would anyone write a tokenizer in C?\" He shrugged: \"Speed.\"",
    "Transformers use self-attention; each token attends to every earlier token in the sequence.",
    "Dr. Smith's lab, founded in 1987, has published over 300 papers on protein folding.",
    "Please RSVP by 5 p.m. EST on Friday, March 3rd, to reserve your seat.",
    "THE MEETING IS CANCELLED. REPEAT: THE MEETING IS CANCELLED!!!",
    "e.g., i.e., etc., vs., Mr., Mrs., Ms., Jr., Sr., Ph.D., U.S.A.",
    "The price rose from $1,299.99 to $1,499.00 - a 15.4% increase in under 3 months.",
    "Rock 'n' roll isn't dead; it's just resting, or so they'd have you believe.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.",
    "Numbers like 3.14159, 2.71828 and 1.41421 appear everywhere in mathematics.",
    "hyphenated-words, under_scored_words, camelCaseWords and PascalCaseWords all differ.",
    "Well... I guess so?! Maybe; maybe not -- who knows.",
]

CODE = [
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"hello, %s\\n\", argv[0]);\n    return 0;\n}\n",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot, *rest = xs\n    return quicksort([x for x in rest if x < pivot]) + [pivot] + quicksort([x for x in rest if x >= pivot])\n",
    "function debounce(fn, ms) {\n\tlet t;\n\treturn (...args) => {\n\t\tclearTimeout(t);\n\t\tt = setTimeout(() => fn.apply(this, args), ms);\n\t};\n}\n",
    "fn main() {\n    let v: Vec<u32> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n",
    "SELECT u.id, COUNT(o.id) AS n_orders\nFROM users u LEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= '2024-01-01'\nGROUP BY u.id HAVING COUNT(o.id) > 5;\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n  <head><meta charset=\"utf-8\"><title>Test</title></head>\n  <body><p class=\"x\">Hi &amp; bye</p></body>\n</html>\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\ndone 2>&1 | sort -n\n",
    "{\"name\": \"kite\", \"version\": \"0.1.0\", \"deps\": [\"pcre2\", \"utf8proc\"], \"ok\": true, \"n\": null}",
    "\\begin{equation}\n  E = mc^2, \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n",
    "template <typename T>\nstd::vector<T> f(const std::vector<T>& v) {\n  return {v.rbegin(), v.rend()};\n}\n",
    "public static void main(String[] args) throws IOException {\n    var map = new HashMap<String, List<Integer>>();\n}\n",
    "x <- c(1, 2, 3)\nmean(x) # 2\ndf %>% filter(a > 0) %>% summarise(m = mean(b))\n",
    "    if (x != NULL && x->next) {\r\n        x = x->next;\r\n    }\r\n",
    "let rec fact n = if n <= 1 then 1 else n * fact (n - 1);;\n",
    "@media (max-width: 600px) {\n  .nav > li:not(:last-child)::after { content: '|'; }\n}\n",
    "mov rax, qword ptr [rbp - 0x18]\nadd rax, 1\ncmp rax, 0x7fffffff\njne .L2\n",
    "// TODO(alice): fix the off-by-one in   range()\n/* multi\n * line */ int x=1;int y = 2 ;\n",
]

MULTILINGUAL = [
    "日本語のテキストです。東京は日本の首都であり、人口は約1400万人です。",
    "中文文本处理需要分词。我想在apple工作1314151天～今天天气很好！",
    "한국어 텍스트 처리는 어렵지 않습니다. 서울은 대한민국의 수도입니다.",
    "Ελληνικά: Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Українська: Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
    "нещо на Български",
    "العربية: نص تجريبي باللغة العربية مع أرقام ١٢٣٤٥٦٧٨٩٠ وعلامات ترقيم؟",
    "עברית: זהו טקסט לדוגמה בעברית עם ניקוד: שָׁלוֹם",
    "हिन्दी: यह एक परीक्षण वाक्य है। संख्याएँ: १२३४५",
    "ภาษาไทย: การทดสอบตัวตัดคำภาษาไทยโดยไม่มีช่องว่าง",
    "កាន់តែពិសេសអាចខលចេញ",
    "Tiếng Việt: Cửa Việt, Hà Nội, Thành phố Hồ Chí Minh.",
    "Türkçe: İstanbul'da ılık bir gün; Iğdır ve Şanlıurfa.",
    "Deutsch: Größenwahn, Straße, Äpfel, Übermaß, Öl — ẞ GROSS.",
    "Français : « Ça va ? » — L'été dernier, j'ai mangé des crêpes à Noël.",
    "Español: ¿Dónde está el niño? ¡Allí! Año, pingüino, corazón.",
    "Polski: Zażółć gęślą jaźń. Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "ქართული ენა, Հայերեն լեզու, አማርኛ ቋንቋ, ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ",
    "தமிழ் மொழி, తెలుగు భాష, ಕನ್ನಡ, മലയാളം, বাংলা ভাষা, ગુજરાતી, ਪੰਜਾਬੀ",
    "Ⅵ-a, ¼-a, ½-a, ¾-a, a 〇b, 𝟘𝟙𝟚, ①②③, ²³¹, ٠١٢",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝓈𝒸𝓇𝒾𝓅𝓉 ａｂｃ ＡＢＣ １２３",
]

EMOJI = [
    "😀", "👍", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🏴‍☠️", "🇺🇸", "🇯🇵", "🇩🇪🇫🇷",
    "❤️", "❤", "1️⃣", "#️⃣", "🧑🏿‍🤝‍🧑🏻", "😶‍🌫️", "🫠", "🦙", "🚀", "✅", "🤷‍♀️", "👁️‍🗨️", "🐕‍🦺", "🏃🏾‍♂️‍➡️",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "©️", "™", "↔️", "☺︎",
]

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]

WHITESPACE_PARTS = [" ", " ", " ", "  ", "\t", "\n", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029",
                    "\u0085", "\u180e", "\u000b", "\u000c", "\u001c", "\u001f", "\u200b", "\u2009", "\u202f", "\ufeff"]

# The cases llama.cpp's tokenizer tests (test-tokenizer-0, test-tokenizer-random) list as edge cases.
LLAMA_CPP_EDGE_CASES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "Hello world", " Hello world", "Hello World",
    " Hello World", " Hello World!", "Hello, world!", " Hello, world!", " this is 🦙.cpp", "w048 7tuijk dsdfhu",
    "нещо на Български", "កាន់តែពិសេសអាចខលចេញ",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "Hello", " Hello", "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =", "' era",
    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3", "33", "333", "3333", "33333",
    "333333", "3333333", "33333333", "333333333", "Cửa Việt", " discards",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 "
    "3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL",
    "\x1f-a", "¼-a", "½-a", "¾-a", "a 〇b", "Ⅵ-a", "\ufeff//", "<s>a", "<unk><|endoftext|><s>", "a\na", "\"`",
    " \u2e4e", "\n\x0b  ", "a\xa0\xa0\x00b", "one <mask>", "a </s> b", "a <mask> b", "\xa0aC", "\u2029 \ua3e4",
    "a ?", "å", "\U000ac517", "\U000522f4", "<s><s><unk><s>a<s>b<s>c<unk>d<unk></s>",
    "<s> <s> <unk><s>a<s>b<s>c<unk>d<unk></s>",
]


def random_code_point(rng):
    """A random Unicode scalar value, weighted towards the planes where text lives."""
    r = rng.random()
    if r < 0.55:
        lo, hi = 0x80, 0xFFFF
    elif r < 0.75:
        lo, hi = 0x10000, 0x1FFFF
    elif r < 0.85:
        lo, hi = 0x20000, 0x3FFFF
    elif r < 0.9:
        lo, hi = 0xE0000, 0x10FFFF
    else:
        lo, hi = 0, 0x7F
    while True:
        c = rng.randint(lo, hi)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def byte_level_table():
    """GPT-2's bytes <-> unicode mapping, used to turn vocab strings back into bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def generate(rng, vocab_tokens):
    cases = []  # (category, text or bytes)

    def add(category, value):
        cases.append((category, value))

    for s in LLAMA_CPP_EDGE_CASES:
        add("llama_cpp_edge", s)

    # English prose, paragraphs with varied whitespace between sentences.
    for _ in range(250):
        k = rng.randint(1, 6)
        parts = []
        for _ in range(k):
            parts.append(rng.choice(ENGLISH))
            parts.append(rng.choice([" ", " ", "  ", "\n", "\n\n", " \n", "\r\n", "\t"]))
        s = "".join(parts)
        if rng.random() < 0.2:
            s = s.upper()
        elif rng.random() < 0.2:
            s = s.lower()
        add("english", s.rstrip() if rng.random() < 0.5 else s)

    # Code, with tab/space re-indentation and CRLF variants.
    for _ in range(200):
        s = rng.choice(CODE)
        r = rng.random()
        if r < 0.25:
            s = s.replace("    ", "\t")
        elif r < 0.5:
            s = s.replace("\n", "\r\n")
        elif r < 0.6:
            s = s.replace("\t", "  ")
        if rng.random() < 0.3:
            s = s + rng.choice(CODE)
        add("code", s)

    for _ in range(200):
        picked = rng.sample(MULTILINGUAL, rng.randint(1, 3))
        add("multilingual", rng.choice([" ", "\n", ""]).join(picked))

    # Emoji sequences: ZWJ, skin tones, flags, keycaps, joined with text or with nothing.
    for _ in range(150):
        n = rng.randint(1, 8)
        seps = ["", "", " ", "\n", "a", "1", ". "]
        add("emoji", "".join(rng.choice(EMOJI) + rng.choice(seps) for _ in range(n)))

    # Combining marks and NFC/NFD pairs: both spellings of accented words, base + random marks, Hangul jamo.
    words = ["café", "naïve", "Ångström", "résumé", "Việt Nam", "São Paulo", "Ελληνικά", "한국어", "Å Ω K",
             "e\u0301\u0323", "o\u0308\u0304", "ḍ̇", "ẛ̣", "\u1e0b\u0323", "q\u0307\u0323", "가각\u1100\u1161\u11a8",
             "\u212b\u2126\u212a", "\uf900\uf901", "ﬁ ﬂ ﬀ", "\u0958\u0959", "\u0344\u0340"]
    for w in words:
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            add("nfc_nfd", unicodedata.normalize(form, w))
    marks = [chr(c) for c in list(range(0x300, 0x370)) + [0x483, 0x591, 0x5b0, 0x64b, 0x93c, 0x94d, 0x1ab0, 0x1dc0,
                                                           0x20d0, 0x302a, 0x3099, 0x309a, 0xfe20, 0x1d165]]
    bases = "aeiouAEIOUnNcCsSzZ ωαΑкКאب가ㄱ\u1100\u1161あカ1 .\t"
    for _ in range(300):
        s = ""
        for _ in range(rng.randint(1, 6)):
            s += rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
        add("combining", s)

    # Runs of whitespace mixed with words.
    for _ in range(250):
        s = ""
        for _ in range(rng.randint(1, 10)):
            s += "".join(rng.choice(WHITESPACE_PARTS) for _ in range(rng.randint(0, 6)))
            s += rng.choice(["word", "Hello", "a", "1", "!", "x=1", "日本", "", "-", "'s", "ü"])
        add("whitespace", s)

    # Digits and long numbers, in several scripts and with separators.
    for _ in range(150):
        digits = rng.choice(["0123456789", "0123456789", "٠١٢٣٤٥٦٧٨٩", "０１２３４５６７８９", "०१२३४५६७८९", "¹²³⁴", "ⅠⅡⅢⅣⅤ"])
        n = "".join(rng.choice(digits) for _ in range(rng.randint(1, 40)))
        fmt = rng.choice(["{}", " {}", "{}.{}", "${},{}", "{}e-{}", "v{}.{}", "{}%", "({})", "-{}", "{}{}{}"])
        add("numbers", fmt.replace("{}", n, 1).replace("{}", str(rng.randint(0, 10 ** rng.randint(1, 30)))))

    # Contractions in every case, after words, spaces or nothing, followed by letters or not.
    contractions = ["s", "t", "re", "ve", "m", "ll", "d"]
    for c in contractions:
        variants = set()
        for mask in range(1 << len(c)):
            variants.add("".join(ch.upper() if mask >> i & 1 else ch for i, ch in enumerate(c)))
        for v in sorted(variants):
            for before in ["", "I", "you", "He", " ", "x "]:
                for after in ["", " ", "x", "'", "."]:
                    add("contractions", before + "'" + v + after)
                    if rng.random() < 0.15:
                        add("contractions", before + "\u2019" + v + after)
    for s in ["'ſ", "it'ſ", "'\u212a", "'ſt", "'ﬅ", "'ß", "'İ", "'ı", "'Ǳ", "'ǅ", "don'T", "WON'T'S", "''s", "'s's"]:
        add("contractions", s)

    # Special tokens inside text, adjacent to each other, partial, with whitespace around.
    for tok in SPECIALS:
        add("special", tok)
        add("special", "x" + tok + "y")
        add("special", " " + tok + " ")
        add("special", tok[:-1])
        add("special", "<" + tok + ">")
    for _ in range(250):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.5:
                parts.append(rng.choice(SPECIALS))
            elif r < 0.8:
                parts.append(rng.choice(["user\n", "Hello", " ", "\n", "  ", "assistant\n", "<", "|", ">", "<|", "|>",
                                         "日本", "'s", "<think>\n\n", "\n\n"]))
            else:
                parts.append(rng.choice(ENGLISH)[: rng.randint(0, 30)])
        add("special", "".join(parts))

    # URLs, e-mail addresses, paths.
    hosts = ["example.com", "api.github.com", "xn--bcher-kva.example", "localhost:8080", "192.168.0.1", "[::1]"]
    paths = ["/", "/path/to/file.txt", "/search?q=kite+tokenizer&lang=en#top", "/a%20b/%E2%9C%93", "/~user/", ""]
    for _ in range(150):
        s = rng.choice(["https://", "http://", "ftp://", "file:///", "mailto:", ""]) + rng.choice(hosts) + rng.choice(paths)
        if rng.random() < 0.3:
            s = "See " + s + " for details."
        add("url", s)
    for s in ["user.name+tag@example.co.uk", "C:\\Users\\Public\\Documents\\file.docx", "../../etc/passwd",
              "~/.config/kite/config.json", "git@github.com:org/repo.git"]:
        add("url", s)

    # Random Unicode code points.
    for _ in range(400):
        add("random_unicode", "".join(random_code_point(rng) for _ in range(rng.randint(1, 24))))

    # Random sequences of vocabulary tokens (as llama.cpp's random vocab-word test does).
    for _ in range(250):
        pieces = [rng.choice(vocab_tokens) for _ in range(rng.randint(1, 12))]
        add("random_vocab", b"".join(pieces).decode("utf-8", errors="replace"))

    # Byte strings that are not valid UTF-8 (kite decodes them as errors="replace").
    bad = [b"\xff", b"\xc0\x80", b"\xe2\x82", b"a\xe2\x82b", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf0\x9f\x98",
           b"\x80\x80\x80", b"caf\xe9", b"\xef\xbb\xbf\xfe\xff", b"<|im_start|>\xff<|im_end|>", b"\xc3", b"ok\xc3 ok"]
    for b in bad:
        add("invalid_utf8", b)
    for _ in range(60):
        add("invalid_utf8", bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 24))))

    # Long inputs: BPE on long words, long runs, repeated patterns.
    for s in ["a" * 1000, "ab" * 700, "abc" * 500, " " * 1000, "\n" * 500, "1234567890" * 100, "\t" * 300,
              "😀" * 200, "日本" * 300, "hello " * 300, "x" * 5000, "_" * 2000, "-=" * 500, ("word " * 50 + "\n") * 10,
              "supercalifragilisticexpialidocious" * 20, " \u00a0" * 400]:
        add("long", s)
    return cases


def probe_text(c):
    """A string around the code point c whose split depends on how c is classified (letter, number, space,
    other, case folding) and normalized (composition with its neighbours)."""
    return "a" + c + "b " + c + "1" + c + "\n" + c + " '" + c + "x" + c + c + "." + c + "\t"


def code_point_signatures(tok, out_path):
    norm = tok.normalizer
    pre = tok.pre_tokenizer
    rows = []
    current = None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        text = probe_text(chr(cp))
        normalized = norm.normalize_str(text)
        pieces = pre.pre_tokenize_str(normalized)
        sig = ",".join(str(len(p)) for p, _ in pieces)
        if normalized != text:
            sig += "|" + normalized.encode("utf-8").hex()
        if current is not None and current[2] == sig and current[1] == cp - 1:
            current[1] = cp
        else:
            if current is not None:
                rows.append(current)
            current = [cp, cp, sig]
    rows.append(current)
    with open(out_path, "w", encoding="ascii") as f:
        f.write("# first_hex last_hex signature: probe piece lengths in bytes [|normalized probe hex]; see make_corpus.py\n")
        for first, last, sig in rows:
            f.write("%x %x %s\n" % (first, last, sig))
    return len(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--probe-out")
    args = ap.parse_args()

    from tokenizers import Tokenizer, __version__
    tok = Tokenizer.from_file(args.tokenizer)
    rng = random.Random(SEED)

    with open(args.tokenizer, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    table = byte_level_table()
    vocab_tokens = [bytes(table[ch] for ch in t) for t in sorted(vocab, key=vocab.get)]

    cases = generate(rng, vocab_tokens)
    n = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for category, value in cases:
            row = {"category": category}
            if isinstance(value, bytes):
                row["hex"] = value.hex()
                text = value.decode("utf-8", errors="replace")
            else:
                row["text"] = value
                text = value
            enc = tok.encode(text, add_special_tokens=False)
            row["ids"] = enc.ids
            row["decoded"] = tok.decode(enc.ids, skip_special_tokens=False)
            f.write(json.dumps(row, ensure_ascii=True) + "\n")
            n += 1
    print("corpus: %d strings, tokenizers %s" % (n, __version__))
    if args.probe_out:
        print("code point probe ranges: %d" % code_point_signatures(tok, args.probe_out))


if __name__ == "__main__":
    sys.exit(main())
