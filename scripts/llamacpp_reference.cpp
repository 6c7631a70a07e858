// llama.cpp's own answers on a GGUF file, as the reference for the engine's GGUF parity tests:
// how its tokenizer splits texts, and its top-5 logprobs at every position of a prompt.
// Built against a llama.cpp build by scripts/make_tiny_gguf.py; one thread, CPU only, an f32
// KV cache.
//
//   llamacpp_reference MODEL.gguf logprobs ID,ID,...     one JSON line: {"top5": [[[id, lp] x5] per position]}
//   llamacpp_reference MODEL.gguf tokenize TEXT          one JSON line: {"ids": [...]} (BOS as the file
//                                                        says, special tokens parsed)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <algorithm>

#include "llama.h"

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf logprobs IDS | tokenize TEXT\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::string mode = argv[2];

    if (mode == "tokenize") {
        const std::string text = argv[3];
        std::vector<llama_token> ids(text.size() + 16);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), ids.data(), (int) ids.size(), true, true);
        if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
        printf("{\"ids\": [");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]}\n");
        return 0;
    }

    std::vector<llama_token> ids;
    for (char * p = strtok(argv[3], ","); p; p = strtok(nullptr, ",")) ids.push_back(atoi(p));
    const int n = (int) ids.size();
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = std::max(64, n);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    // An f32 cache: its default f16 would round every key and value.
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot make a context\n"); return 1; }
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    printf("{\"top5\": [");
    for (int i = 0; i < n; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        double mx = l[0];
        for (int j = 1; j < n_vocab; j++) mx = std::max(mx, (double) l[j]);
        double sum = 0;
        for (int j = 0; j < n_vocab; j++) sum += std::exp((double) l[j] - mx);
        const double lse = mx + std::log(sum);
        std::vector<int> order(n_vocab);
        for (int j = 0; j < n_vocab; j++) order[j] = j;
        std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                          [&](int a, int b) { return l[a] > l[b]; });
        printf("%s[", i ? ", " : "");
        for (int k = 0; k < 5; k++) printf("%s[%d, %.6f]", k ? ", " : "", order[k], l[order[k]] - lse);
        printf("]");
    }
    printf("]}\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
