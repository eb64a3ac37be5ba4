//! `turbospark synth --gguf`: the GGUF reads back through our reader with
//! llama.cpp's gpt-oss names, the install converted from it holds exactly
//! the weights `synth` writes without `--gguf`, and — where the llama.cpp
//! tools of scripts/llamacpp/build.sh are built — llama.cpp loads the file,
//! `llama-bench` runs on it, and its greedy tokens and log-probabilities
//! (ref_logits) agree with ours in `--numerics llama-cpp`.

mod common;

use common::Work;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use turbospark_format::gguf::{GgufFile, GgufValue};
use turbospark_format::install::Install;

const BIN: &str = env!("CARGO_BIN_EXE_turbospark");

/// Small gpt-oss dimensions (vocabulary: 256 bytes + filler + EOS).
const DIMS: [&str; 18] = [
    "--layers",
    "2",
    "--experts",
    "4",
    "--top-k",
    "2",
    "--hidden",
    "128",
    "--expert-intermediate",
    "128",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "32",
    "--vocab",
    "384",
];
const VOCAB: usize = 384;

fn turbospark(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `synth` into `dst` (with `--gguf gguf` when given), router skew 1.
fn synth(dst: &Path, gguf: Option<&Path>) {
    synth_with(dst, gguf, &[]);
}

/// `synth` as [`synth`] with `extra` arguments.
fn synth_with(dst: &Path, gguf: Option<&Path>, extra: &[&str]) {
    let mut args = vec!["synth", dst.to_str().unwrap(), "-q", "--router-skew", "1"];
    args.extend(DIMS);
    args.extend(extra);
    if let Some(g) = gguf {
        args.extend(["--gguf", g.to_str().unwrap()]);
    }
    ok(&turbospark(&args));
}

/// `b` (converted from the GGUF) holds `a`'s family and resident tensors,
/// each with the same format, shape and bytes.
fn assert_same_resident(a: &Install, b: &Install) {
    assert_eq!(a.manifest.arch.family, b.manifest.arch.family);
    assert_eq!(a.index.tensors.len(), b.index.tensors.len());
    for t in &a.index.tensors {
        let (ta, da) = a.tensor(&t.name).unwrap();
        let (tb, db) = b
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from the GGUF install", t.name));
        assert_eq!((ta.dtype, &ta.shape), (tb.dtype, &tb.shape), "{}", t.name);
        assert!(da == db, "{} differs", t.name);
    }
}

fn expert_bytes(install: &Install, layer: usize, expert: usize, part: &str) -> Vec<u8> {
    let l = install.manifest.expert_layer(layer).unwrap();
    let p = l.part(part).unwrap();
    let file = std::fs::read(install.expert_path(l)).unwrap();
    let at = (expert as u64 * l.stride + p.offset) as usize;
    file[at..at + p.length as usize].to_vec()
}

/// `--resident-format bf16`: the attention, router, embedding and head
/// matrices are bf16 in the GGUF (ggml type 30) and in the install, the
/// experts still MXFP4, and the install converted from the GGUF holds the
/// same bytes as the one written directly; `--like` refuses the option
/// (it copies the formats of its source).
#[test]
fn resident_format_bf16_keeps_gpt_oss_own_formats() {
    let work = Work::new("ts-synth-gguf-bf16");
    let direct = work.0.join("direct");
    let via = work.0.join("via");
    let gguf = work.0.join("m.gguf");
    synth_with(&direct, None, &["--resident-format", "bf16"]);
    synth_with(&via, Some(&gguf), &["--resident-format", "bf16"]);
    let g = GgufFile::open(&gguf).unwrap();
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.1.attn_output.weight",
        "blk.0.ffn_gate_inp.weight",
        "output.weight",
    ] {
        assert_eq!(g.tensor(name).unwrap().ggml_type, 30, "{name}: BF16");
    }
    assert_eq!(
        g.tensor("blk.0.ffn_up_exps.weight").unwrap().ggml_type,
        39,
        "MXFP4"
    );
    assert_eq!(
        g.tensor("blk.0.attn_norm.weight").unwrap().ggml_type,
        0,
        "F32"
    );
    let a = Install::open(&direct).unwrap();
    assert_same_resident(&a, &Install::open(&via).unwrap());
    let mut bf16 = 0;
    for t in &a.index.tensors {
        let (ta, _) = a.tensor(&t.name).unwrap();
        if ta.shape.len() == 2 {
            assert_eq!(ta.dtype, turbospark_core::QuantFormat::Bf16, "{}", t.name);
            bf16 += 1;
        }
    }
    assert!(bf16 >= 2 + 2 * 5, "only {bf16} bf16 matrices");
    let like = turbospark(&[
        "synth",
        work.0.join("like").to_str().unwrap(),
        "--like",
        direct.to_str().unwrap(),
        "--resident-format",
        "bf16",
    ]);
    assert!(!like.status.success(), "--like took --resident-format");
}

#[test]
fn gguf_has_llama_cpp_names_and_converts_to_the_same_weights() {
    let work = Work::new("ts-synth-gguf-same");
    let direct = work.0.join("direct");
    let via = work.0.join("via");
    let gguf = work.0.join("m.gguf");
    synth(&direct, None);
    synth(&via, Some(&gguf));

    let g = GgufFile::open(&gguf).unwrap();
    let s = |k: &str| g.get(k).and_then(GgufValue::as_str).map(str::to_string);
    let u = |k: &str| g.get(k).and_then(GgufValue::as_u64);
    assert_eq!(s("general.architecture").as_deref(), Some("gpt-oss"));
    assert_eq!(s("tokenizer.ggml.model").as_deref(), Some("gpt2"));
    assert_eq!(u("gpt-oss.block_count"), Some(2));
    assert_eq!(u("gpt-oss.expert_count"), Some(4));
    assert_eq!(u("gpt-oss.expert_used_count"), Some(2));
    assert_eq!(u("gpt-oss.attention.sliding_window"), Some(128));
    assert_eq!(u("gpt-oss.expert_feed_forward_length"), Some(128));
    assert_eq!(s("gpt-oss.rope.scaling.type").as_deref(), Some("yarn"));
    assert_eq!(u("tokenizer.ggml.eos_token_id"), Some(VOCAB as u64 - 1));
    let tokens = g.get("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.as_array().map(|a| a.len()), Some(VOCAB));
    for name in [
        "blk.0.post_attention_norm.weight",
        "blk.1.attn_sinks.weight",
        "blk.0.ffn_gate_inp.bias",
        "output.weight",
    ] {
        assert!(g.tensor(name).is_some(), "{name} missing");
    }
    assert!(g.tensor("blk.0.ffn_norm.weight").is_none());
    let gate = g.tensor("blk.1.ffn_gate_exps.weight").unwrap();
    assert_eq!(gate.shape(), [4, 128, 128]);
    assert_eq!(gate.ggml_type, 39, "MXFP4");
    assert_eq!(
        g.tensor("blk.1.ffn_down_exps.bias").unwrap().shape(),
        [4, 128]
    );

    let a = Install::open(&direct).unwrap();
    let b = Install::open(&via).unwrap();
    assert_same_resident(&a, &b);
    for l in &a.manifest.experts {
        for e in 0..l.num_experts {
            for p in &l.parts {
                assert!(
                    expert_bytes(&a, l.layer, e, &p.name) == expert_bytes(&b, l.layer, e, &p.name),
                    "layer {} expert {e} part {} differs",
                    l.layer,
                    p.name
                );
            }
        }
    }
}

#[test]
fn synth_gguf_refuses_what_it_cannot_write() {
    let work = Work::new("ts-synth-gguf-refuse");
    let gguf = work.0.join("m.gguf");
    let dst = work.0.join("inst");
    // Too small a vocabulary for the byte tokens.
    let mut args = vec!["synth", dst.to_str().unwrap(), "-q", "--gguf"];
    args.push(gguf.to_str().unwrap());
    args.extend(&DIMS[..16]);
    args.extend(["--vocab", "100"]);
    let out = turbospark(&args);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least 257 tokens"), "{err}");
    assert!(!gguf.exists() && !dst.exists());
    // An existing GGUF is kept unless --force.
    std::fs::write(&gguf, b"keep").unwrap();
    let mut args = vec!["synth", dst.to_str().unwrap(), "-q", "--gguf"];
    args.push(gguf.to_str().unwrap());
    args.extend(DIMS);
    let out = turbospark(&args);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&gguf).unwrap(), b"keep");
}

/// The llama.cpp tools, when scripts/llamacpp/build.sh has built them.
fn llama_tool(name: &str) -> Option<PathBuf> {
    let p = common::cache_dir().join("llama.cpp-build/bin").join(name);
    p.is_file().then_some(p)
}

/// Our raw logits `[n, vocab]` of `tokens` (one prefill).
fn our_logits(install: &Path, tokens: &[u32], work: &Path) -> Vec<Vec<f32>> {
    let out = work.join("logits.npy");
    let ids: Vec<String> = tokens.iter().map(u32::to_string).collect();
    ok(&turbospark(&[
        "logits",
        "--model",
        install.to_str().unwrap(),
        "--tokens",
        &ids.join(","),
        "--numerics",
        "llama-cpp",
        "--out",
        out.to_str().unwrap(),
    ]));
    let bytes = std::fs::read(&out).unwrap();
    let header = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let data: Vec<f32> = bytes[10 + header..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    data.chunks(VOCAB).map(<[f32]>::to_vec).collect()
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

#[test]
fn llama_cpp_loads_it_and_agrees() {
    let (Some(bench), Some(ref_logits)) = (llama_tool("llama-bench"), llama_tool("ref_logits"))
    else {
        println!("skipped: llama.cpp tools not built (scripts/llamacpp/build.sh builds them)");
        return;
    };
    let work = Work::new("ts-synth-gguf-llama");
    let inst = work.0.join("inst");
    let gguf = work.0.join("m.gguf");
    synth(&inst, Some(&gguf));

    let out = Command::new(&bench)
        .args([
            "-m",
            gguf.to_str().unwrap(),
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
        ])
        .args(["-t", "1", "-o", "jsonl"])
        .output()
        .unwrap();
    let rows: Vec<Value> = ok(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "pp8 and tg4");
    assert!(rows.iter().all(|r| r["avg_ts"].as_f64().unwrap() > 0.0));

    let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8];
    let ref_json = work.0.join("ref.json");
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(&ref_logits)
        .args(["-m", gguf.to_str().unwrap(), "-p", &ids.join(",")])
        .args([
            "-n",
            "6",
            "-k",
            "5",
            "-t",
            "1",
            "-o",
            ref_json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&std::fs::read(&ref_json).unwrap()).unwrap();
    let greedy = common::json_ids(&r["greedy_ids"]);
    // Teacher-forced: the prompt and llama.cpp's greedy tokens but the last.
    let mut seq = prompt.to_vec();
    seq.extend(&greedy[..greedy.len() - 1]);
    let ours = our_logits(&inst, &seq, &work.0);
    for (step, s) in r["steps"].as_array().unwrap().iter().enumerate() {
        let lp = log_softmax(&ours[prompt.len() - 1 + step]);
        for t in s["top"].as_array().unwrap() {
            let (id, want) = (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap());
            assert!(
                (lp[id] - want).abs() < 1e-3,
                "step {step} token {id}: ours {} llama.cpp {want}",
                lp[id]
            );
        }
    }
}
