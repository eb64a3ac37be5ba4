// ref_logits.cpp — greedy decoding + top-k log-probabilities straight from
// llama.cpp's raw logits, for use as a numerical reference.
//
//   ref_logits -m MODEL.gguf -p ID,ID,... [-n 32] [-k 64] [-t 1] [-c 0]
//              [--kv f16|f32] [--fa off|on|auto] [-o OUT.json]
//              [--prompt-text TEXT] [--meta KEY=JSON]...
//
// * The prompt ids are fed verbatim (nothing is added: no BOS, no special
//   tokens). The whole prompt is decoded as one batch (logits requested only
//   for the last position), then each generated token is decoded one at a time.
// * Greedy: the next token is the argmax of the raw logits (ties -> lowest id).
//   No sampler is involved.  Generation does not stop on EOG; every step
//   records whether its token is an end-of-generation token.
// * For every generated position: log-softmax over the whole vocabulary,
//   computed in double precision from the float logits, top-k (id, logprob),
//   sorted by logprob descending (ties -> lower id first).
// * The llama.cpp log (incl. the `print_info:` lines) goes to stderr.
//
// Build: see scripts/llamacpp/build.sh (links against the libllama built there).

#include "llama.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

static void usage(const char * argv0) {
    fprintf(stderr,
            "usage: %s -m MODEL.gguf -p ID,ID,... [-n N_PREDICT=32] [-k TOPK=64] [-t THREADS=1]\n"
            "          [-c N_CTX=0(auto)] [--kv f16|f32] [--fa off|on|auto] [-o OUT.json]\n"
            "          [--prompt-text TEXT] [--meta KEY=RAWJSON]...\n",
            argv0);
}

// JSON string literal. Valid UTF-8 passes through; bytes that are not part of
// a valid UTF-8 sequence (token pieces can be partial byte sequences) are
// written as \u00XX (i.e. as the code point U+00XX: lossy but always valid JSON).
static std::string json_str(const std::string & raw) {
    std::string out = "\"";
    size_t i = 0, n = raw.size();
    char buf[8];
    while (i < n) {
        unsigned char c = raw[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (int j = 1; ok && j < len; j++) ok = ((unsigned char) raw[i + j] >> 6) == 0x2;
        if (!ok) {
            snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
            i += 1;
        } else if (len > 1) {
            out.append(raw, i, len);
            i += len;
        } else {
            switch (c) {
                case '"':  out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                default:
                    if (c < 0x20 || c == 0x7f) { snprintf(buf, sizeof(buf), "\\u%04x", c); out += buf; }
                    else out += (char) c;
            }
            i += 1;
        }
    }
    return out + "\"";
}

static std::string piece(const llama_vocab * vocab, llama_token id) {
    std::vector<char> buf(256);
    int n = llama_token_to_piece(vocab, id, buf.data(), (int) buf.size(), 0, true);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab, id, buf.data(), (int) buf.size(), 0, true);
    }
    return n > 0 ? std::string(buf.data(), n) : std::string();
}

static std::string fmt_double(double v) {
    if (std::isinf(v)) return v < 0 ? "-1e999" : "1e999";  // not expected for finite logits
    char buf[64];
    snprintf(buf, sizeof(buf), "%.17g", v);
    return buf;
}

int main(int argc, char ** argv) {
    std::string model_path, ids_arg, out_path, prompt_text, kv = "f16", fa = "off";
    bool have_prompt_text = false;
    int n_predict = 32, top_k = 64, n_threads = 1, n_ctx = 0;
    std::vector<std::pair<std::string, std::string>> meta;

    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { usage(argv[0]); exit(2); }
            return argv[++i];
        };
        if (a == "-m") model_path = next();
        else if (a == "-p") ids_arg = next();
        else if (a == "-n") n_predict = atoi(next().c_str());
        else if (a == "-k") top_k = atoi(next().c_str());
        else if (a == "-t") n_threads = atoi(next().c_str());
        else if (a == "-c") n_ctx = atoi(next().c_str());
        else if (a == "-o") out_path = next();
        else if (a == "--kv") kv = next();
        else if (a == "--fa") fa = next();
        else if (a == "--prompt-text") { prompt_text = next(); have_prompt_text = true; }
        else if (a == "--meta") {
            std::string kvs = next();
            size_t eq = kvs.find('=');
            if (eq == std::string::npos) { usage(argv[0]); return 2; }
            meta.emplace_back(kvs.substr(0, eq), kvs.substr(eq + 1));
        }
        else { usage(argv[0]); return 2; }
    }
    if (model_path.empty() || ids_arg.empty() || n_predict < 1 || top_k < 1 || n_threads < 1) {
        usage(argv[0]);
        return 2;
    }
    if (kv != "f16" && kv != "f32") { fprintf(stderr, "--kv must be f16 or f32\n"); return 2; }
    if (fa != "off" && fa != "on" && fa != "auto") { fprintf(stderr, "--fa must be off, on or auto\n"); return 2; }

    std::vector<llama_token> prompt;
    {
        size_t pos = 0;
        while (pos <= ids_arg.size()) {
            size_t comma = ids_arg.find(',', pos);
            std::string tok = ids_arg.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            if (tok.empty()) { fprintf(stderr, "empty token id in -p\n"); return 2; }
            char * end = nullptr;
            long v = strtol(tok.c_str(), &end, 10);
            if (*end != '\0' || v < 0) { fprintf(stderr, "bad token id '%s'\n", tok.c_str()); return 2; }
            prompt.push_back((llama_token) v);
            if (comma == std::string::npos) break;
            pos = comma + 1;
        }
    }

    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) { fprintf(stderr, "failed to load model %s\n", model_path.c_str()); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token t : prompt) {
        if (t >= n_vocab) { fprintf(stderr, "token id %d >= n_vocab %d\n", t, n_vocab); return 2; }
    }
    if (top_k > n_vocab) top_k = n_vocab;

    const int n_prompt = (int) prompt.size();
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = n_ctx > 0 ? (uint32_t) n_ctx : (uint32_t) (n_prompt + n_predict);
    cparams.n_batch = std::max<uint32_t>(cparams.n_ctx, (uint32_t) n_prompt);
    cparams.n_ubatch = cparams.n_batch;
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.flash_attn_type = fa == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                            : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cparams.type_k = kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cparams.type_v = cparams.type_k;
    cparams.no_perf = true;
    cparams.offload_kqv = false;
    cparams.op_offload = false;

    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    struct Step {
        llama_token token;
        bool eog;
        double logsumexp;
        float max_logit;
        std::vector<std::pair<llama_token, double>> top;
    };
    std::vector<Step> steps;
    std::vector<llama_token> cur = prompt;
    std::vector<double> lp(n_vocab);
    std::vector<int> idx(n_vocab);

    for (int s = 0; s < n_predict; s++) {
        llama_batch batch = llama_batch_get_one(cur.data(), (int32_t) cur.size());
        int rc = llama_decode(ctx, batch);
        if (rc != 0) { fprintf(stderr, "llama_decode failed at step %d: %d\n", s, rc); return 1; }
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (!logits) { fprintf(stderr, "no logits at step %d\n", s); return 1; }

        int amax = 0;
        for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[amax]) amax = i;
        const double m = (double) logits[amax];
        double sum = 0.0;
        for (int i = 0; i < n_vocab; i++) sum += std::exp((double) logits[i] - m);
        const double lse = m + std::log(sum);
        for (int i = 0; i < n_vocab; i++) { lp[i] = (double) logits[i] - lse; idx[i] = i; }
        std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int a, int b) {
            return lp[a] != lp[b] ? lp[a] > lp[b] : a < b;
        });

        Step st;
        st.token = amax;
        st.eog = llama_vocab_is_eog(vocab, amax);
        st.logsumexp = lse;
        st.max_logit = logits[amax];
        for (int j = 0; j < top_k; j++) st.top.emplace_back(idx[j], lp[idx[j]]);
        steps.push_back(std::move(st));

        cur.assign(1, amax);
    }

    // ---- JSON ----
    std::string o;
    o += "{\n";
    o += "  \"tool\": \"scripts/llamacpp/ref_logits.cpp\",\n";
    for (auto & kvp : meta) o += "  " + json_str(kvp.first) + ": " + kvp.second + ",\n";
    {
        std::string base = model_path;
        size_t sl = base.find_last_of('/');
        if (sl != std::string::npos) base = base.substr(sl + 1);
        o += "  \"model_file\": " + json_str(base) + ",\n";
    }
    {
        char desc[256];
        llama_model_desc(model, desc, sizeof(desc));
        o += "  \"model_desc\": " + json_str(desc) + ",\n";
    }
    o += "  \"n_vocab\": " + std::to_string(n_vocab) + ",\n";
    o += "  \"settings\": {\"n_threads\": " + std::to_string(n_threads) +
         ", \"n_ctx\": " + std::to_string(llama_n_ctx(ctx)) +
         ", \"n_batch\": " + std::to_string(cparams.n_batch) +
         ", \"n_ubatch\": " + std::to_string(cparams.n_ubatch) +
         ", \"kv_cache_type\": " + json_str(kv) +
         ", \"flash_attn\": " + json_str(fa) +
         ", \"n_gpu_layers\": 0, \"top_k\": " + std::to_string(top_k) +
         ", \"sampling\": \"greedy argmax of raw logits, ties -> lowest id, no stop on EOG\"" +
         ", \"logprob\": \"log_softmax over full vocab in f64 from f32 logits\"" +
         ", \"prompt_eval\": \"whole prompt in one llama_decode, then one token per llama_decode\"},\n";
    if (have_prompt_text) o += "  \"prompt_text\": " + json_str(prompt_text) + ",\n";
    o += "  \"prompt_ids\": [";
    for (int i = 0; i < n_prompt; i++) o += (i ? ", " : "") + std::to_string(prompt[i]);
    o += "],\n";
    o += "  \"n_predict\": " + std::to_string(n_predict) + ",\n";
    o += "  \"greedy_ids\": [";
    for (size_t i = 0; i < steps.size(); i++) o += (i ? ", " : "") + std::to_string(steps[i].token);
    o += "],\n";
    {
        std::string text;
        for (auto & st : steps) text += piece(vocab, st.token);
        o += "  \"greedy_text\": " + json_str(text) + ",\n";
    }
    o += "  \"steps\": [\n";
    for (size_t i = 0; i < steps.size(); i++) {
        auto & st = steps[i];
        o += "    {\"step\": " + std::to_string(i) + ", \"pos\": " + std::to_string(n_prompt + (int) i - 1) +
             ", \"argmax\": " + std::to_string(st.token) + ", \"piece\": " + json_str(piece(vocab, st.token)) +
             ", \"eog\": " + (st.eog ? "true" : "false") +
             ", \"max_logit\": " + fmt_double(st.max_logit) + ", \"logsumexp\": " + fmt_double(st.logsumexp) +
             ",\n     \"top\": [";
        for (size_t j = 0; j < st.top.size(); j++) {
            o += (j ? ", " : "");
            o += "[" + std::to_string(st.top[j].first) + ", " + fmt_double(st.top[j].second) + "]";
        }
        o += "]}";
        o += (i + 1 < steps.size() ? ",\n" : "\n");
    }
    o += "  ]\n}\n";

    if (out_path.empty()) {
        fputs(o.c_str(), stdout);
    } else {
        FILE * f = fopen(out_path.c_str(), "wb");
        if (!f) { fprintf(stderr, "cannot open %s\n", out_path.c_str()); return 1; }
        fwrite(o.data(), 1, o.size(), f);
        fclose(f);
    }

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
