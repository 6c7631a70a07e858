// llama.cpp's own next-token log-probabilities on a GGUF file, for the engine's parity test
// against llama.cpp (engine/tests/llamacpp_parity.rs). Teacher-forced: the given token ids are
// decoded one at a time (llama.cpp's decode path), and after each the top-K log-probabilities
// of the next token are printed, as one JSON object on stdout:
//   {"file": "...", "threads": N, "tokens": [...], "positions": [[[id, logprob], ...], ...]}
// Usage: llama_logits MODEL THREADS K ID [ID ...]
// Built against llama.cpp's static libraries by scripts/make-llamacpp-quants.sh.

#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL THREADS K ID [ID ...]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    const int threads = atoi(argv[2]);
    const int k = atoi(argv[3]);
    std::vector<llama_token> tokens;
    for (int i = 4; i < argc; i++) {
        tokens.push_back(atoi(argv[i]));
    }

    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) tokens.size() + 16;
    cp.n_batch = cp.n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    // The engine keeps its CPU KV cache in f32: so does this run, so that the comparison
    // measures the weights' and activations' paths, not llama.cpp's default f16 cache.
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    // Plain attention (the flash-attention kernel rounds through f16 on the CPU).
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<int> order(n_vocab);

    printf("{\"file\": \"%s\", \"threads\": %d, \"tokens\": [", path, threads);
    for (size_t i = 0; i < tokens.size(); i++) {
        printf(i == 0 ? "%d" : ", %d", tokens[i]);
    }
    printf("], \"positions\": [");
    for (size_t i = 0; i < tokens.size(); i++) {
        llama_token t = tokens[i];
        if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0) {
            fprintf(stderr, "decode failed at position %zu\n", i);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        double max = logits[0];
        for (int v = 1; v < n_vocab; v++) {
            max = std::max(max, (double) logits[v]);
        }
        double sum = 0.0;
        for (int v = 0; v < n_vocab; v++) {
            sum += std::exp((double) logits[v] - max);
        }
        const double lse = max + std::log(sum);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b]; });
        printf(i == 0 ? "[" : ", [");
        for (int j = 0; j < k; j++) {
            printf(j == 0 ? "[%d, %.6f]" : ", [%d, %.6f]", order[j], (double) logits[order[j]] - lse);
        }
        printf("]");
    }
    printf("]}\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
