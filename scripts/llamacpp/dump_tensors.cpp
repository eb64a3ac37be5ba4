// dump_tensors.cpp — every tensor llama.cpp computes during a greedy run, as
// files, for bisecting numerical differences op by op.
//
//   dump_tensors MODEL.gguf ID,ID,... N_STEPS OUT_DIR
//
// Same settings as ref_logits (1 thread, CPU, f16 KV cache, flash attention
// off, the prompt as one batch, then one token per decode, greedy argmax).
// Step s (0 = the prompt) writes OUT_DIR/<s>/<index>_<tensor name>_<op>.bin:
// an int32 ggml type, int64 ne[4], int64 nb[4], then the tensor's bytes
// (f32 or f16 data is row-major with ne[0] fastest). turbospark's
// `Numerics::LlamaCpp` reproduces these tensors bit for bit; feeding a dumped
// op input through the matching backend op and comparing with the dumped
// output isolates the first op that differs.
//
// Build (after scripts/llamacpp/build.sh; CACHE as there):
//   SRC=$CACHE/llama-cpp-python/vendor/llama.cpp BIN=$CACHE/llama.cpp-build/bin
//   c++ -O2 -std=c++17 -I$SRC/include -I$SRC/ggml/include dump_tensors.cpp
//       -o $BIN/dump_tensors -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN
//   (one command line)

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <vector>

static std::string g_dir;
static int g_step = 0;
static int g_index = 0;

static bool on_tensor(struct ggml_tensor * t, bool ask, void *) {
    if (ask) {
        return true;  // we want every tensor
    }
    std::string name = ggml_get_name(t);
    for (auto & c : name) {
        if (!(isalnum((unsigned char) c) || c == '-' || c == '_' || c == '.')) c = '_';
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%d/%04d_%s_%s.bin", g_dir.c_str(), g_step, g_index++, name.c_str(),
             ggml_op_desc(t));
    std::vector<char> buf(ggml_nbytes(t));
    ggml_backend_tensor_get(t, buf.data(), 0, buf.size());
    FILE * f = fopen(path, "wb");
    if (!f) { perror(path); return true; }
    const int32_t type = t->type;
    fwrite(&type, sizeof type, 1, f);
    for (int i = 0; i < 4; i++) { const int64_t v = t->ne[i]; fwrite(&v, sizeof v, 1, f); }
    for (int i = 0; i < 4; i++) { const int64_t v = (int64_t) t->nb[i]; fwrite(&v, sizeof v, 1, f); }
    fwrite(buf.data(), 1, buf.size(), f);
    fclose(f);
    return true;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf ID,ID,... N_STEPS OUT_DIR\n", argv[0]);
        return 2;
    }
    const std::string ids = argv[2];
    const int n_steps = atoi(argv[3]);
    g_dir = argv[4];
    std::vector<llama_token> prompt;
    for (size_t pos = 0; pos <= ids.size();) {
        const size_t comma = ids.find(',', pos);
        prompt.push_back((llama_token) atoi(ids.substr(pos, comma - pos).c_str()));
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    if (prompt.empty() || n_steps < 1) { fprintf(stderr, "need prompt ids and N_STEPS >= 1\n"); return 2; }

    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) { fprintf(stderr, "failed to load %s\n", argv[1]); return 1; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) (prompt.size() + n_steps);
    cparams.n_batch = std::max<uint32_t>(cparams.n_ctx, (uint32_t) prompt.size());
    cparams.n_ubatch = cparams.n_batch;
    cparams.n_seq_max = 1;
    cparams.n_threads = 1;
    cparams.n_threads_batch = 1;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k = GGML_TYPE_F16;
    cparams.type_v = GGML_TYPE_F16;
    cparams.no_perf = true;
    cparams.offload_kqv = false;
    cparams.op_offload = false;
    cparams.cb_eval = on_tensor;
    cparams.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "failed to create a context\n"); return 1; }

    mkdir(g_dir.c_str(), 0755);
    std::vector<llama_token> cur = prompt;
    for (int s = 0; s < n_steps; s++) {
        g_step = s;
        g_index = 0;
        const std::string step_dir = g_dir + "/" + std::to_string(s);
        mkdir(step_dir.c_str(), 0755);
        if (llama_decode(ctx, llama_batch_get_one(cur.data(), (int32_t) cur.size())) != 0) {
            fprintf(stderr, "llama_decode failed at step %d\n", s);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
        printf("step %d -> %d\n", s, best);
        cur.assign(1, best);
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
