"""Drives a running `turbospark serve` with the official `openai` and
`anthropic` Python clients, streaming and not, and checks every answer
against `turbospark run`'s greedy answer for the same messages (computed by
the caller, crates/cli/tests/serve.rs, and passed as a JSON file).

Usage: clients.py BASE_URL API_KEY MODEL_ID CASES.json
CASES.json: [{"name", "system" (or null), "user" (or null), "raw" (or null),
              "max_tokens", "text", "finish": "stop"|"length"}]
Prints one line per check and, last, "N passed, N failed".
"""

import json
import sys

import anthropic
import openai

base, key, model, cases_path = sys.argv[1:5]
cases = json.load(open(cases_path))
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}: {detail}")


oa = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
an = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)

ids = [m.id for m in oa.models.list().data]
check("models.list", ids == [model], ids)

for c in cases:
    n = c["name"]
    want, finish = c["text"], c["finish"]
    if c.get("raw") is not None:
        r = oa.completions.create(model=model, prompt=c["raw"], temperature=0,
                                  max_tokens=c["max_tokens"])
        check(f"{n}: completions", r.choices[0].text == want, (r.choices[0].text, want))
        check(f"{n}: completions finish", r.choices[0].finish_reason == finish,
              r.choices[0].finish_reason)
        got = "".join(ch.choices[0].text for ch in oa.completions.create(
            model=model, prompt=c["raw"], temperature=0, max_tokens=c["max_tokens"],
            stream=True))
        check(f"{n}: completions stream", got == want, (got, want))
        continue

    msgs = ([{"role": "system", "content": c["system"]}] if c["system"] else []) + [
        {"role": "user", "content": c["user"]}]
    r = oa.chat.completions.create(model=model, messages=msgs, temperature=0,
                                   max_tokens=c["max_tokens"], seed=1)
    check(f"{n}: chat", r.choices[0].message.content == want,
          (r.choices[0].message.content, want))
    check(f"{n}: chat finish", r.choices[0].finish_reason == finish, r.choices[0].finish_reason)
    u = r.usage
    check(f"{n}: chat usage", u.completion_tokens > 0 and u.prompt_tokens > 0
          and u.total_tokens == u.prompt_tokens + u.completion_tokens, u)

    # Content as parts gives the same answer.
    parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) for m in msgs]
    r2 = oa.chat.completions.create(model=model, messages=parts, temperature=0,
                                    max_tokens=c["max_tokens"])
    check(f"{n}: chat content parts", r2.choices[0].message.content == want,
          r2.choices[0].message.content)

    chunks = list(oa.chat.completions.create(
        model=model, messages=msgs, temperature=0, max_tokens=c["max_tokens"], stream=True,
        stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(f"{n}: chat stream", text == want, (text, want))
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(f"{n}: chat stream finish", finishes == [finish], finishes)
    check(f"{n}: chat stream usage", chunks[-1].usage is not None and not chunks[-1].choices
          and chunks[-1].usage.completion_tokens == u.completion_tokens, chunks[-1])

    # Recent clients no longer take `temperature` as an argument; it goes in
    # the body as the Messages API documents it.
    kw = dict(model=model, max_tokens=c["max_tokens"], extra_body={"temperature": 0},
              messages=[{"role": "user", "content": c["user"]}])
    if c["system"]:
        kw["system"] = c["system"]
    m = an.messages.create(**kw)
    check(f"{n}: messages", m.content[0].text == want, (m.content[0].text, want))
    want_stop = {"stop": "end_turn", "length": "max_tokens"}[finish]
    check(f"{n}: messages stop_reason", m.stop_reason == want_stop, m.stop_reason)
    check(f"{n}: messages usage", m.usage.output_tokens == u.completion_tokens
          and m.usage.input_tokens == u.prompt_tokens, m.usage)
    with an.messages.stream(**kw) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    check(f"{n}: messages stream", text == want, (text, want))
    check(f"{n}: messages stream final", final.stop_reason == want_stop
          and final.usage.output_tokens == u.completion_tokens, final)

# Stop sequences: the answer up to the stop string, which is left out.
c = next(c for c in cases if c.get("user") and " " in c["text"])
stop = c["text"].split(" ")[1]
prefix = c["text"][: c["text"].index(stop)]
msgs = [{"role": "user", "content": c["user"]}] if not c["system"] else [
    {"role": "system", "content": c["system"]}, {"role": "user", "content": c["user"]}]
r = oa.chat.completions.create(model=model, messages=msgs, temperature=0,
                               max_tokens=c["max_tokens"], stop=[stop])
check("chat stop string", (r.choices[0].message.content, r.choices[0].finish_reason)
      == (prefix, "stop"), (r.choices[0].message.content, prefix))
kw = dict(model=model, max_tokens=c["max_tokens"], extra_body={"temperature": 0},
          stop_sequences=[stop],
          messages=[{"role": "user", "content": c["user"]}])
if c["system"]:
    kw["system"] = c["system"]
m = an.messages.create(**kw)
check("messages stop_sequence", (m.content[0].text, m.stop_reason, m.stop_sequence)
      == (prefix, "stop_sequence", stop), m)

# Errors, as each client sees them.
try:
    openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    check("openai bad key", False, "no error")
except openai.AuthenticationError as e:
    check("openai bad key", e.status_code == 401, e)
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    check("anthropic bad key", False, "no error")
except anthropic.AuthenticationError as e:
    check("anthropic bad key", e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body)
try:
    oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    check("openai unknown model", False, "no error")
except openai.NotFoundError as e:
    check("openai unknown model", e.code == "model_not_found", e)
try:
    an.messages.create(model="no-such-model", max_tokens=4,
                       messages=[{"role": "user", "content": "hi"}])
    check("anthropic unknown model", False, "no error")
except anthropic.NotFoundError as e:
    check("anthropic unknown model", e.body["error"]["type"] == "not_found_error", e.body)
try:
    oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "word " * 5000}])
    check("openai context length", False, "no error")
except openai.BadRequestError as e:
    check("openai context length", e.code == "context_length_exceeded", e)
try:
    oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                               temperature="hot")
    check("openai wrong type", False, "no error")
except openai.BadRequestError as e:
    check("openai wrong type", e.type == "invalid_request_error", e)
try:
    an.messages.create(model=model, max_tokens=4, messages=[{"role": "robot", "content": "x"}])
    check("anthropic bad role", False, "no error")
except anthropic.BadRequestError as e:
    check("anthropic bad role", e.body["error"]["type"] == "invalid_request_error", e.body)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
