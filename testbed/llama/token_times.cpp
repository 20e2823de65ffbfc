// Times each of llama.cpp's decode steps after a prompt, the way odmoe's
// -stats times its decode passes (decode_pass_ms), so that the two
// engines' spreads can be set side by side in one run.
//
//   token_times MODEL.gguf PROMPT GEN THREADS
//     decodes the prompt, then GEN steps, and prints one line:
//     "passes P10 P50 P90" (ms, nearest rank; the first step not counted)
//     (testbed/decode-spread).
//   token_times MODEL.gguf PROMPT GEN THREADS stepped
//     decodes the prompt and prints "ready"; then, for each line "N" read
//     from stdin, decodes N more steps and prints their times in ms on one
//     line, until stdin closes or GEN steps are done (odmoe bench kernels
//     -llama-times, which runs its own steps between llama.cpp's blocks).
//
// A step is llama_decode of one token and the argmax of its logits.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static void quiet(ggml_log_level, const char *, void *) {}

// step decodes next and leaves the argmax of its logits in it.
static bool step(llama_context * ctx, std::vector<llama_token> & next, int n_vocab) {
    if (llama_decode(ctx, llama_batch_get_one(next.data(), next.size())) != 0) return false;
    const float * logits = llama_get_logits_ith(ctx, -1);
    llama_token best = 0;
    for (llama_token t = 1; t < n_vocab; t++) if (logits[t] > logits[best]) best = t;
    next.assign(1, best);
    return true;
}

int main(int argc, char ** argv) {
    const bool stepped = argc == 6 && strcmp(argv[5], "stepped") == 0;
    if (argc != 5 && !stepped) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT GEN THREADS [stepped]\n", argv[0]);
        return 2;
    }
    const int n_prompt = atoi(argv[2]), n_gen = atoi(argv[3]), threads = atoi(argv[4]);
    if (n_prompt < 1 || n_gen < 2 || threads < 1) {
        fprintf(stderr, "want PROMPT >= 1, GEN >= 2, THREADS >= 1\n");
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_prompt + n_gen + 8;
    cp.n_batch = cp.n_ctx;
    cp.n_threads = cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context for %s\n", argv[1]); return 1; }

    std::vector<llama_token> next;
    for (int i = 0; i < n_prompt; i++) next.push_back((i * 7919 + 1) % n_vocab);
    if (stepped) {
        if (!step(ctx, next, n_vocab)) { fprintf(stderr, "the prompt's decode failed\n"); return 1; }
        printf("ready\n");
        fflush(stdout);
        int done = 0, n;
        while (done < n_gen && scanf("%d", &n) == 1) {
            n = std::min(n, n_gen - done);
            for (int i = 0; i < n; i++) {
                auto t0 = std::chrono::steady_clock::now();
                if (!step(ctx, next, n_vocab)) { fprintf(stderr, "decode failed at step %d\n", done); return 1; }
                printf("%s%.4f", i ? " " : "", std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                done++;
            }
            printf("\n");
            fflush(stdout);
        }
    } else {
        std::vector<double> ms;
        auto last = std::chrono::steady_clock::now();
        for (int i = 0; i < n_gen; i++) {
            if (!step(ctx, next, n_vocab)) { fprintf(stderr, "decode failed at step %d\n", i); return 1; }
            auto now = std::chrono::steady_clock::now();
            if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(now - last).count());
            last = now;
        }
        std::sort(ms.begin(), ms.end());
        auto at = [&](double p) { long k = (long)std::ceil(p * ms.size()) - 1; return ms[std::max(0L, k)]; };
        printf("%zu %.4f %.4f %.4f\n", ms.size(), at(0.1), at(0.5), at(0.9));
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
