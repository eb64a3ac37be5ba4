#!/usr/bin/env python3
"""Record llama.cpp's tokenization of fixed texts for the cached real models.

Writes crates/text/tests/fixtures/tokenize/<model>.json with the ids that
`llama-tokenize` (built by scripts/llamacpp/build.sh) produces for each text,
with and without special tokens added (BOS) and parsed (chat markup).
The Rust test tests/real_vocab_parity.rs compares against these files.

Usage: scripts/text/record_tokenizer_fixtures.py
Environment: TURBOSPARK_CACHE (default ~/.cache/turbospark),
             LLAMA_TOKENIZE (default $CACHE/llama.cpp-build/bin/llama-tokenize)
"""
import json
import os
import subprocess
import sys
import tempfile

CACHE = os.environ.get("TURBOSPARK_CACHE", os.path.expanduser("~/.cache/turbospark"))
TOOL = os.environ.get("LLAMA_TOKENIZE", os.path.join(CACHE, "llama.cpp-build/bin/llama-tokenize"))
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../crates/text/tests/fixtures/tokenize")

COMMON = [
    "",
    "Hello world",
    " Hello world",
    "Hello  world\n\nHow are you?",
    "   leading and trailing spaces   ",
    "\t tabs\tand\r\nCRLF\n",
    "The year 2024 had 366 days; 1234567890 is ten digits.",
    "I'm sure they'll've done it, didn't they? 'quoted' words",
    "def add(a, b):\n    return a + b  # sum\n",
    "Ünïcödé façade naïve café — “quotes” … ½ ∑ ∞",
    "日本語のテキストと中文文本，还有한국어 텍스트.",
    "مرحبا بالعالم שלום עולם",
    "Emoji: 🦙🔥👍🏽 and 🇫🇷 flags",
    "e\u0301 combining and \u200b zero width",
    "<s> </s> <unk> look like special tokens",
    "multiple\n\n\n\nnewlines\n \n end",
    "x" * 40 + " " + "ab" * 30,
]

MODELS = {
    "smollm2-135m-instruct-q4_1.gguf": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>text<|im_end|>",
    ],
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": [
        "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nWrite code<|im_end|>\n<|im_start|>assistant\n",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    ],
    "gemma3-270m-q4_k_m.gguf": [
        "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos>",
    ],
}


def tokenize(model, text, add_special, parse_special):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        cmd = [TOOL, "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not add_special:
            cmd.append("--no-bos")
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
        return json.loads(out.splitlines()[-1])
    finally:
        os.unlink(path)


def main():
    if not os.path.exists(TOOL):
        sys.exit(f"{TOOL} not found: build llama.cpp with scripts/llamacpp/build.sh")
    version = subprocess.run([TOOL, "--version"], capture_output=True, text=True)
    version = (version.stdout + version.stderr).strip().splitlines()[0]
    os.makedirs(OUT, exist_ok=True)
    for name, extra in MODELS.items():
        model = os.path.join(CACHE, "models", name)
        cases = []
        for text in COMMON + extra:
            for add_special in (True, False):
                for parse_special in (True, False):
                    ids = tokenize(model, text, add_special, parse_special)
                    cases.append({"text": text, "add_special": add_special,
                                  "parse_special": parse_special, "ids": ids})
        path = os.path.join(OUT, name.replace(".gguf", ".json"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"model": name, "tool": version, "cases": cases}, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
