#!/usr/bin/python3
"""Renders chat templates with Python Jinja2 under Hugging Face's settings.

Writes tests/goldens/chat_templates/matrix.json: every template (the three
fixture templates from ../shared/fixtures/tokenizers/*/tokenizer_config.json
and the hand-written ones in tests/goldens/chat_templates/templates/) rendered
over a matrix of conversations, the way transformers' apply_chat_template
does it (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[generation tag, loopcontrols]), tojson = json.dumps with
ensure_ascii=False, raise_exception and strftime_now globals, context =
messages, tools, documents, add_generation_prompt, special tokens, kwargs;
continue_final_message post-processing). A case whose render raises records
the error message instead of `rendered`.

strftime_now is pinned to 2024-07-26 09:05:00 local time so the goldens are
reproducible; the C++ test passes the same time.

Run: /usr/bin/python3 tools/reference/render_chat_templates.py
(needs python3-jinja2 3.1; the goldens were made with Jinja2 3.1.2).
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.environ.get("LUMEN_FIXTURES", os.path.join(ROOT, "..", "shared", "fixtures"))
GOLDEN_DIR = os.path.join(ROOT, "tests", "goldens", "chat_templates")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 5, 0)


class GenerationTag(jinja2.ext.Extension):
    """HF's {% generation %} tag: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def apply_chat_template(env, source, conv, specials):
    """Mirrors transformers' render_jinja_template for one conversation."""
    template = env.from_string(source)
    messages = conv["messages"]
    kwargs = dict(specials)
    kwargs.update(conv.get("kwargs", {}))
    rendered = template.render(messages=messages, tools=conv.get("tools"),
                               documents=conv.get("documents"),
                               add_generation_prompt=conv.get("add_generation_prompt", False),
                               **kwargs)
    if conv.get("continue_final_message"):
        final = messages[-1]["content"]
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    final = block["text"]
                    break
            else:
                raise ValueError("no text block in the final message")
        if final.strip() not in rendered:
            raise ValueError("final message does not appear in the rendered chat")
        loc = rendered.rindex(final.strip())
        if rendered[loc:loc + len(final.lstrip())] == final:
            rendered = rendered[:loc + len(final.lstrip())]
        else:
            rendered = rendered[:loc + len(final.strip())]
    return rendered


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — returns snippets.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "items": {"type": "array",
                                                                  "items": {"type": "string"}}},
                       "required": ["query"]},
    },
}

TOOL_CALL_CONV = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call12345", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": {"city": "Paris", "unit": "celsius",
                                                "days": 2, "ratio": 1.0, "tiny": 1e-07,
                                                "flag": True, "none": None}}}]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
     "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."},
    {"role": "user", "content": "Thanks!"},
]

CONVERSATIONS = [
    {"id": "user-hello", "messages": [{"role": "user", "content": "Hello!"}]},
    {"id": "user-hello-genprompt", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Hello!"}]},
    {"id": "system-user-genprompt", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Hi there"}]},
    {"id": "multiturn-system", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "2+2 equals 4."},
                  {"role": "user", "content": "And 3+3?"},
                  {"role": "assistant", "content": "6."},
                  {"role": "user", "content": "Thanks."}]},
    {"id": "multiturn-nosystem", "add_generation_prompt": False,
     "messages": [{"role": "user", "content": "One"},
                  {"role": "assistant", "content": "Two"},
                  {"role": "user", "content": "Three"},
                  {"role": "assistant", "content": "Four"}]},
    {"id": "tools-defined", "add_generation_prompt": True, "tools": [WEATHER_TOOL, SEARCH_TOOL],
     "messages": [{"role": "user", "content": "What's the weather in Paris?"}]},
    {"id": "tools-with-system", "add_generation_prompt": True, "tools": [WEATHER_TOOL],
     "messages": [{"role": "system", "content": "Use tools when needed."},
                  {"role": "user", "content": "Weather in Oslo?"}]},
    {"id": "tool-calls-and-results", "add_generation_prompt": True,
     "tools": [WEATHER_TOOL], "messages": TOOL_CALL_CONV},
    {"id": "tool-call-string-args", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Search cats"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "abcdefghi", "type": "function",
                                   "function": {"name": "search",
                                                "arguments": "{\"query\": \"cats\"}"}}]},
                  {"role": "tool", "tool_call_id": "abcdefghi", "content": "Cats are great."},
                  {"role": "tool", "tool_call_id": "abcdefghi", "content": "More cats."}]},
    {"id": "assistant-prefill", "continue_final_message": True,
     "messages": [{"role": "user", "content": "Write a haiku."},
                  {"role": "assistant", "content": "Autumn moonlight "}]},
    {"id": "assistant-prefill-plain", "continue_final_message": True,
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Count to three."},
                  {"role": "assistant", "content": "One, two"}]},
    {"id": "empty-content", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": ""},
                  {"role": "user", "content": "   "}]},
    {"id": "unicode-emoji", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "Réponds en français. 日本語もOK。"},
                  {"role": "user", "content": "héllo wörld 🌍🚀 — “quotes” 'single' \"double\" "
                                              "back\\slash <tag> & amp\ttab\u00a0nbsp\n\nnewlines"},
                  {"role": "assistant", "content": "Ça va 👍\u200d ok"},
                  {"role": "user", "content": "\u3000全角スペース\u3000"}]},
    {"id": "thinking-disabled", "add_generation_prompt": True,
     "kwargs": {"enable_thinking": False},
     "messages": [{"role": "user", "content": "Quick question."}]},
    {"id": "thinking-enabled", "add_generation_prompt": True,
     "kwargs": {"enable_thinking": True},
     "messages": [{"role": "user", "content": "Think hard."}]},
    {"id": "reasoning-history", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello!"},
                  {"role": "user", "content": "Again"},
                  {"role": "assistant", "content": "Hello again!",
                   "reasoning_content": "They repeat."},
                  {"role": "user", "content": "Bye"}]},
    {"id": "last-assistant-reasoning", "add_generation_prompt": False,
     "messages": [{"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}]},
    {"id": "list-content", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe "},
                                               {"type": "image"},
                                               {"type": "text", "text": " this image. "}]}]},
    {"id": "roles-not-alternating", "add_generation_prompt": True,
     "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
    {"id": "whitespace-content", "add_generation_prompt": True,
     "messages": [{"role": "system", "content": "  padded system  \n"},
                  {"role": "user", "content": "\n\n  padded user\t\n"}]},
]


def fixture_templates():
    out = []
    for model in ("qwen3", "llama3_1", "gemma3"):
        path = os.path.join(FIXTURES, "tokenizers", model, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        specials = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            tok = cfg.get(key)
            if isinstance(tok, dict):
                tok = tok.get("content")
            if tok:
                specials[key] = tok
        out.append({"name": model, "fixture": model, "source": cfg["chat_template"],
                    "special_tokens": specials})
    return out


CUSTOM_SPECIALS = {
    "hermes_qwen25_tools": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "mistral_tools": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
    "llama31_tools": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "macros": {"bos_token": "<BOS>", "eos_token": "<EOS>"},
    "kitchen_sink": {"bos_token": "<s>", "eos_token": "</s>"},
}


def custom_templates():
    out = []
    tdir = os.path.join(GOLDEN_DIR, "templates")
    for name in sorted(CUSTOM_SPECIALS):
        with open(os.path.join(tdir, name + ".jinja"), encoding="utf-8", newline="") as f:
            source = f.read()
        out.append({"name": name, "file": "templates/" + name + ".jinja", "source": source,
                    "special_tokens": CUSTOM_SPECIALS[name]})
    return out


def main():
    env = make_env()
    templates = fixture_templates() + custom_templates()
    cases = []
    for t in templates:
        convs = CONVERSATIONS if t["name"] != "kitchen_sink" else CONVERSATIONS[:4]
        for conv in convs:
            case = {"template": t["name"], "conversation": conv["id"]}
            try:
                case["rendered"] = apply_chat_template(env, t["source"], conv,
                                                       t["special_tokens"])
            except Exception as e:  # noqa: BLE001 - the golden records any failure
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    templates_out = []
    for t in templates:
        entry = {k: v for k, v in t.items() if k != "source"}
        if "fixture" in t:
            entry["source"] = t["source"]
        templates_out.append(entry)
    golden = {
        "generated_by": "tools/reference/render_chat_templates.py",
        "jinja2_version": jinja2.__version__,
        "strftime_now": FIXED_NOW.isoformat(),
        "templates": templates_out,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    path = os.path.join(GOLDEN_DIR, "matrix.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"wrote {path}: {len(cases)} cases ({n_err} errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
