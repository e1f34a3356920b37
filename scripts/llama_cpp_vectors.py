#!/usr/bin/env python3
"""Test vectors for the llama crate from llama.cpp (issue 29, item 5), on the same .gguf.

Run outside CI (llama-cpp-python compiles llama.cpp; see docs/model.md for the version and the command):

    python3 scripts/llama_cpp_vectors.py MODEL.gguf > crates/llama/tests/llama_cpp_vectors.json

It writes the token ids of a dozen strings (control tokens not recognised), and for several chats the
prompt rendered by the file's own Jinja chat template, its token ids (control tokens recognised), 48 greedy
tokens, and at each step llama.cpp's five largest logits. llama.cpp runs on the CPU with an f32 KV cache
and no flash attention, so that the cache holds what the Rust model's holds.
"""
import json
import sys

import jinja2
import llama_cpp
import numpy as np

CONTINUATION = 48
TOP = 5

STRINGS = [
    "Hello, world! This is a plain ASCII sentence.",
    "Café naïve résumé à l'été, Größe und Übermaß, señor, São Paulo.",
    "你好，世界！日本語のテキストと한국어 문장.",
    "Emoji: 👋🌍🚀 and a family 👨‍👩‍👧 with skin tone 👍🏽.",
    'fn main() {\n    let x = vec![1, 2, 3];\n    println!("{:?}", x.iter().sum::<i32>());\n}\n',
    "a  b   c\t\td\n\n\ne      f        ",
    "    leading and trailing spaces    ",
    "Numbers: 3.14159, 1234567890, and 2024-12-03T10:00:00Z.",
    "I'm sure they'll say we've done what you'd've done; it's JOHN'S.",
    "def f(x):\r\n\treturn x ** 2  # square\r\n",
    "Literal control text <|im_start|>user\nhi<|im_end|> stays text.",
    "Ελληνικά, русский текст, العربية, עברית, हिन्दी.",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain recursion to a child in two sentences."}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one line."},
        {"role": "user", "content": "List three primary colors."},
    ],
    [
        {"role": "user", "content": "Hi, my name is Ana."},
        {"role": "assistant", "content": "Hello Ana! How can I help you today?"},
        {"role": "user", "content": "What is my name?"},
    ],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
]


def main():
    path = sys.argv[1]
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=1024,
        n_batch=512,
        n_threads=2,
        logits_all=True,
        flash_attn=False,
        type_k=0,  # GGML_TYPE_F32
        type_v=0,
        seed=0,
        verbose=False,
    )
    template = jinja2.Environment(loader=jinja2.BaseLoader()).from_string(
        llm.metadata["tokenizer.chat_template"]
    )
    strings = [
        {"text": s, "ids": llm.tokenize(s.encode("utf-8"), add_bos=False, special=False)}
        for s in STRINGS
    ]
    chats = []
    for messages in CHATS:
        text = template.render(messages=messages, add_generation_prompt=True)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        continuation, top = [], []
        for _ in range(CONTINUATION):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits, kind="stable")[:TOP]
            top.append([[int(i), float(logits[i])] for i in order])
            nxt = int(order[0])
            continuation.append(nxt)
            llm.eval([nxt])
        chats.append(
            {
                "messages": messages,
                "prompt": text,
                "prompt_ids": ids,
                "continuation": continuation,
                "continuation_text": llm.detokenize(continuation).decode("utf-8", "replace"),
                "top_logits": top,
            }
        )
    out = {
        "generator": "scripts/llama_cpp_vectors.py",
        "llama_cpp_python": llama_cpp.__version__,
        "settings": "n_ctx=1024 n_batch=512 n_threads=2 logits_all flash_attn=False type_k=type_v=F32",
        "strings": strings,
        "chats": chats,
    }
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
