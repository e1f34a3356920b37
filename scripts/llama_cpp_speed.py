#!/usr/bin/env python3
"""llama.cpp's prompt processing and generation speed on the same .gguf (issue 29, item 7), for
docs/benchmarks.md beside `cargo xtask bench`'s model_* figures. Run outside CI (see docs/model.md for
how llama-cpp-python was built):

    python3 scripts/llama_cpp_speed.py MODEL.gguf [THREADS [REPEATS]]

One thread per core unless THREADS is given; an f32 KV cache and no flash attention, as for the vectors.
Prompt processing: a 512-token prompt in one batch (tok/s, best of 3); generation: 128 tokens after it,
one at a time (tok/s, best of 3). Prints one JSON object.
"""
import json
import os
import sys
import time

import llama_cpp

PROMPT_TOKENS = 512
GEN_TOKENS = 128
REPEATS = 3


def main():
    path = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else REPEATS
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=PROMPT_TOKENS + GEN_TOKENS + 8,
        n_batch=PROMPT_TOKENS + GEN_TOKENS + 8,
        n_ubatch=PROMPT_TOKENS,
        n_threads=threads,
        n_threads_batch=threads,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
    )
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 200)
    prompt = llm.tokenize(text.encode(), add_bos=False)[:PROMPT_TOKENS]
    best_pp, best_tg = 0.0, 0.0
    for _ in range(repeats):
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt)
        best_pp = max(best_pp, len(prompt) / (time.perf_counter() - started))
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        started = time.perf_counter()
        for _ in range(GEN_TOKENS):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        best_tg = max(best_tg, GEN_TOKENS / (time.perf_counter() - started))
    print(json.dumps({
        "llama_cpp_python": llama_cpp.__version__,
        "threads": threads,
        "repeats": repeats,
        "prompt_tokens": len(prompt),
        "prompt_tok_s": round(best_pp, 1),
        "gen_tokens": GEN_TOKENS,
        "gen_tok_s_batch1": round(best_tg, 1),
    }))


if __name__ == "__main__":
    main()
