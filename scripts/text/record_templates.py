#!/usr/bin/env python3
"""Record reference chat-template renderings for tests/chat_template_parity.rs.

Each fixture in crates/text/tests/fixtures/templates/<name>.json holds a chat
template, the inputs, and the string transformers' `render_jinja_template`
(the function behind `apply_chat_template`, jinja2 with HF's environment:
trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, raise_exception,
strftime_now) renders for them. `strftime_now` is pinned to NOW below.

Sources: the SmolLM2 and Qwen2.5-Coder GGUFs' `tokenizer.chat_template`, and
llama.cpp's models/templates/*.jinja from the llama-cpp-python sdist (the
three the tests require plus every other one jinja2 renders for the fixed
conversation, as extra coverage in fixtures/templates/extra/).

Usage: /tmp/hfvenv/bin/python scripts/text/record_templates.py
(needs transformers 5.24.0, jinja2 >= 3.1.6 and the gguf package)
"""
import datetime as _dt
import glob
import json
import os
import sys

import transformers
import transformers.utils.chat_template_utils as ctu
from gguf import GGUFReader

CACHE = os.environ.get("TURBOSPARK_CACHE", os.path.expanduser("~/.cache/turbospark"))
TEMPLATES = os.path.join(CACHE, "llama-cpp-python/vendor/llama.cpp/models/templates")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../crates/text/tests/fixtures/templates")
NOW = _dt.datetime(2025, 6, 15, 9, 30, 5)
NOW_UNIX = int(NOW.replace(tzinfo=_dt.timezone.utc).timestamp())


class _PinnedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


ctu.datetime = _PinnedDatetime

MESSAGES = [
    {"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Japan? Answer with \"quotes\" & <tags> — ünïcødé."},
]


# A tool list for the `-tools` fixtures: exercises HF's tojson (key order,
# non-ASCII, floats, nesting) inside the templates' tool sections.
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — in °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Tōkyō\""},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
                "units": {"type": "string", "enum": ["metric", "imperial"]},
            },
            "required": ["city"],
        },
    },
}]
TOOLS_FOR = {"qwen2.5-coder", "qwen3", "gpt-oss", "gemma-4", "smollm2"}


def gguf_template(path):
    r = GGUFReader(path)
    f = r.fields["tokenizer.chat_template"]
    tokens = r.fields["tokenizer.ggml.tokens"]

    def tok(key):
        fld = r.fields.get(key)
        if fld is None:
            return None
        return tokens.contents(int(fld.contents()))

    return f.contents(), tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id")


def render(template, bos, eos, tools=None):
    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    rendered, _ = ctu.render_jinja_template(
        conversations=[MESSAGES], tools=tools, chat_template=template, add_generation_prompt=True,
        **kwargs)
    return rendered[0]


def write(path, name, source, template, bos, eos, expected, tools=None):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({
            "name": name,
            "source": source,
            "renderer": f"transformers {transformers.__version__} render_jinja_template",
            "template": template,
            "messages": MESSAGES,
            "tools": tools,
            "add_generation_prompt": True,
            "bos_token": bos,
            "eos_token": eos,
            "now_unix": NOW_UNIX,
            "expected": expected,
        }, f, ensure_ascii=False, indent=1)
        f.write("\n")


REQUIRED_FILES = {
    "gpt-oss": ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
    "gemma-4": ("google-gemma-4-31B-it.jinja", "<bos>", "<eos>"),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", None, "<|im_end|>"),
}


def main():
    os.makedirs(os.path.join(OUT, "extra"), exist_ok=True)
    for name, gguf in [("smollm2", "smollm2-135m-instruct-q4_1.gguf"),
                       ("qwen2.5-coder", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")]:
        template, bos, eos = gguf_template(os.path.join(CACHE, "models", gguf))
        write(os.path.join(OUT, f"{name}.json"), name, f"{gguf}: tokenizer.chat_template",
              template, bos, eos, render(template, bos, eos))
        print(f"{name}: recorded")
    used = set()
    for name, (file, bos, eos) in REQUIRED_FILES.items():
        template = open(os.path.join(TEMPLATES, file), encoding="utf-8").read()
        write(os.path.join(OUT, f"{name}.json"), name, f"llama.cpp models/templates/{file}",
              template, bos, eos, render(template, bos, eos))
        used.add(file)
        print(f"{name}: recorded")
    for path in sorted(glob.glob(os.path.join(TEMPLATES, "*.jinja"))):
        file = os.path.basename(path)
        if file in used:
            continue
        template = open(path, encoding="utf-8").read()
        try:
            expected = render(template, "<s>", "</s>")
        except Exception as e:  # templates that reject this conversation
            print(f"extra {file}: skipped ({type(e).__name__}: {str(e)[:80]})")
            continue
        write(os.path.join(OUT, "extra", file.replace(".jinja", ".json")), file[:-6],
              f"llama.cpp models/templates/{file}", template, "<s>", "</s>", expected)
    for name in sorted(TOOLS_FOR):
        with open(os.path.join(OUT, f"{name}.json"), encoding="utf-8") as f:
            base = json.load(f)
        expected = render(base["template"], base["bos_token"], base["eos_token"], TOOLS)
        write(os.path.join(OUT, f"{name}-tools.json"), f"{name}-tools", base["source"],
              base["template"], base["bos_token"], base["eos_token"], expected, TOOLS)
        print(f"{name}-tools: recorded")
    print("done")


if __name__ == "__main__":
    sys.exit(main())
