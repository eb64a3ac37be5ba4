//! Convert, open and verify small synthetic checkpoints, and every kind of
//! bad input the converter must refuse without leaving anything behind.

mod support;

use std::path::Path;
use support::{ggml, safetensors_bytes, ty, GgufBuilder, StSpec, TempDir, TensorSpec, V};
use turbospark_format::convert::{convert, ConvertOptions};
use turbospark_format::install::verify::FileStatus;
use turbospark_format::install::{verify_install, Install};
use turbospark_format::FormatError;

const HIDDEN: u64 = 32;
const HEADS: u64 = 4;
const KV: u64 = 2;
const HEAD_DIM: u64 = 8;
const FFN: u64 = 64;
const VOCAB: u64 = 64;
const EXPERTS: u64 = 4;

/// Deterministic pseudo-random f32 bytes.
fn f32_bytes(n: u64, seed: u64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5).to_le_bytes()
        })
        .collect()
}

fn run_convert(src: &Path, dst: &Path, force: bool) -> Result<(), FormatError> {
    convert(src, dst, ConvertOptions { force }, &mut |_| {}).map(|_| ())
}

/// Names in `dir` (to prove a failed convert left nothing behind).
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A one-layer llama GGUF in f32, tensors as llama.cpp names them.
fn llama_gguf() -> GgufBuilder {
    let tokens: Vec<V> = (0..VOCAB).map(|i| V::str(&format!("t{i}"))).collect();
    let mut b = GgufBuilder::default()
        .kv("general.architecture", V::str("llama"))
        .kv("llama.embedding_length", V::U32(HIDDEN as u32))
        .kv("llama.block_count", V::U32(1))
        .kv("llama.attention.head_count", V::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", V::U32(KV as u32))
        .kv("llama.feed_forward_length", V::U32(FFN as u32))
        .kv("llama.context_length", V::U32(256))
        .kv("llama.rope.freq_base", V::F32(50000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5))
        .kv("tokenizer.ggml.tokens", V::Arr(ty::STRING, tokens))
        .kv("tokenizer.ggml.bos_token_id", V::U32(1));
    // dims innermost first, as GGUF stores them.
    let tensors: [(&str, Vec<u64>); 11] = [
        ("token_embd.weight", vec![HIDDEN, VOCAB]),
        ("blk.0.attn_norm.weight", vec![HIDDEN]),
        ("blk.0.attn_q.weight", vec![HIDDEN, HEADS * HEAD_DIM]),
        ("blk.0.attn_k.weight", vec![HIDDEN, KV * HEAD_DIM]),
        ("blk.0.attn_v.weight", vec![HIDDEN, KV * HEAD_DIM]),
        ("blk.0.attn_output.weight", vec![HEADS * HEAD_DIM, HIDDEN]),
        ("blk.0.ffn_norm.weight", vec![HIDDEN]),
        ("blk.0.ffn_gate.weight", vec![HIDDEN, FFN]),
        ("blk.0.ffn_up.weight", vec![HIDDEN, FFN]),
        ("blk.0.ffn_down.weight", vec![FFN, HIDDEN]),
        ("output_norm.weight", vec![HIDDEN]),
    ];
    for (i, (name, dims)) in tensors.iter().enumerate() {
        let n = dims.iter().product();
        b = b.tensor(TensorSpec::new(
            name,
            ggml::F32,
            dims,
            f32_bytes(n, i as u64),
        ));
    }
    b
}

fn mixtral_config() -> serde_json::Value {
    serde_json::json!({
        "model_type": "mixtral",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "num_local_experts": EXPERTS, "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 128, "tie_word_embeddings": false,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "bos_token_id": 1, "eos_token_id": 2
    })
}

/// Tensors of a 2-layer Mixtral with per-expert (legacy) names, f32.
fn mixtral_tensors() -> Vec<(String, Vec<u64>)> {
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".into(), vec![HIDDEN]),
        ("lm_head.weight".into(), vec![VOCAB, HIDDEN]),
    ];
    for l in 0..2 {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        t.push((p("input_layernorm.weight"), vec![HIDDEN]));
        t.push((p("post_attention_layernorm.weight"), vec![HIDDEN]));
        t.push((p("self_attn.q_proj.weight"), vec![HEADS * HEAD_DIM, HIDDEN]));
        t.push((p("self_attn.k_proj.weight"), vec![KV * HEAD_DIM, HIDDEN]));
        t.push((p("self_attn.v_proj.weight"), vec![KV * HEAD_DIM, HIDDEN]));
        t.push((p("self_attn.o_proj.weight"), vec![HIDDEN, HEADS * HEAD_DIM]));
        t.push((p("block_sparse_moe.gate.weight"), vec![EXPERTS, HIDDEN]));
        for e in 0..EXPERTS {
            let q = |w: &str| p(&format!("block_sparse_moe.experts.{e}.{w}.weight"));
            t.push((q("w1"), vec![FFN, HIDDEN]));
            t.push((q("w3"), vec![FFN, HIDDEN]));
            t.push((q("w2"), vec![HIDDEN, FFN]));
        }
    }
    t
}

fn write_hf(dir: &TempDir, config: &serde_json::Value, tensors: &[(String, Vec<u64>)]) {
    dir.write("config.json", &serde_json::to_vec(config).unwrap());
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, (_, s))| f32_bytes(s.iter().product(), 100 + i as u64))
        .collect();
    let specs: Vec<StSpec> = tensors
        .iter()
        .zip(&data)
        .map(|((name, shape), d)| StSpec {
            name,
            dtype: "F32",
            shape,
            data: d,
        })
        .collect();
    dir.write("model.safetensors", &safetensors_bytes(&specs, &[]));
}

#[test]
fn gguf_converts_opens_and_verifies() {
    let tmp = TempDir::new("conv-gguf");
    let src = tmp.write("m.gguf", &llama_gguf().build());
    let dst = tmp.path().join("install");
    run_convert(&src, &dst, false).unwrap();
    let install = Install::open(&dst).unwrap();
    let a = &install.manifest.arch;
    // The dimensions written into the metadata above.
    assert_eq!(
        (
            a.hidden_size,
            a.num_heads,
            a.num_kv_heads,
            a.head_dim,
            a.vocab_size
        ),
        (32, 4, 2, 8, 64)
    );
    assert_eq!(a.layers[0].rope.unwrap().theta, 50000.0);
    assert!(a.head.tied, "no output.weight means a tied head");
    assert_eq!(install.manifest.generation.bos_token_id, Some(1));
    // Bytes are copied verbatim.
    let (entry, bytes) = install.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!(entry.shape, vec![KV * HEAD_DIM, HIDDEN]);
    assert_eq!(bytes, &f32_bytes(KV * HEAD_DIM * HIDDEN, 3)[..]);
    assert_eq!(entry.offset % 64, 0);
    assert!(verify_install(&dst, &mut |_, _| {}).unwrap().all_ok());
}

#[test]
fn the_manifest_names_the_family_by_its_id_and_an_unknown_one_is_refused() {
    let tmp = TempDir::new("conv-family-id");
    let src = tmp.write("m.gguf", &llama_gguf().build());
    let dst = tmp.path().join("install");
    run_convert(&src, &dst, false).unwrap();
    let path = dst.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(manifest["arch"]["family"], "llama");
    manifest["arch"]["family"] = "not_a_family".into();
    std::fs::write(&path, serde_json::to_string(&manifest).unwrap()).unwrap();
    let err = Install::open(&dst)
        .err()
        .expect("an unknown family is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("\"not_a_family\"") && msg.contains("qwen3_moe"),
        "{msg}"
    );
}

#[test]
fn hf_mixtral_experts_land_at_fixed_strides_and_a_flipped_bit_fails_verify() {
    let tmp = TempDir::new("conv-mixtral");
    let src = TempDir::new("conv-mixtral-src");
    let tensors = mixtral_tensors();
    write_hf(&src, &mixtral_config(), &tensors);
    let dst = tmp.path().join("install");
    run_convert(src.path(), &dst, false).unwrap();
    let install = Install::open(&dst).unwrap();
    let layer = install.manifest.expert_layer(1).unwrap();
    assert_eq!(layer.stride % 4096, 0);
    assert_eq!(layer.num_experts, EXPERTS as usize);
    // Expert 2's up projection (w3) sits at 2 * stride + offset(up).
    let idx = tensors
        .iter()
        .position(|(n, _)| n == "model.layers.1.block_sparse_moe.experts.2.w3.weight")
        .unwrap();
    let want = f32_bytes(FFN * HIDDEN, 100 + idx as u64);
    let file = std::fs::read(dst.join(&layer.file)).unwrap();
    let up = layer.part("up").unwrap();
    let at = (2 * layer.stride + up.offset) as usize;
    assert_eq!(&file[at..at + want.len()], &want[..]);

    // Flip one bit of expert 3 in layer 0's file.
    let path = dst.join(&install.manifest.expert_layer(0).unwrap().file);
    let mut bytes = std::fs::read(&path).unwrap();
    let pos = bytes.len() - 100;
    bytes[pos] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
    let report = verify_install(&dst, &mut |_, _| {}).unwrap();
    assert!(!report.all_ok());
    let failed: Vec<_> = report.failures().collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0.path, "experts/000.bin");
    assert!(matches!(failed[0].1, FileStatus::HashMismatch { .. }));
}

#[test]
fn truncated_gguf_is_refused_and_leaves_nothing() {
    let tmp = TempDir::new("conv-trunc");
    let full = llama_gguf().build();
    for cut in [10, full.len() / 3, full.len() - 7] {
        let src = tmp.write("cut.gguf", &full[..cut]);
        let before = entries(tmp.path());
        let err = run_convert(&src, &tmp.path().join("out"), false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("cut.gguf")
                && (msg.contains("ends")
                    || msg.contains("truncat")
                    || msg.contains("past the end")
                    || msg.contains("end of file")
                    || msg.contains("outside")),
            "cut at {cut}: {msg}"
        );
        assert_eq!(
            entries(tmp.path()),
            before,
            "cut at {cut} left files behind"
        );
    }
}

#[test]
fn gguf_tensor_past_the_end_is_named() {
    let tmp = TempDir::new("conv-oob");
    let mut b = llama_gguf();
    let full = b.build();
    // Point the last tensor beyond the file.
    let last = b.tensors.len() - 1;
    b.tensors[last].offset_override = Some(full.len() as u64 * 2 / 32 * 32);
    let src = tmp.write("oob.gguf", &b.build());
    let err = run_convert(&src, &tmp.path().join("out"), false).unwrap_err();
    assert!(err.to_string().contains("output_norm.weight"), "{err}");
    assert!(!tmp.path().join("out").exists());
}

#[test]
fn safetensors_header_longer_than_file_is_refused() {
    let src = TempDir::new("conv-sthdr");
    src.write(
        "config.json",
        &serde_json::to_vec(&mixtral_config()).unwrap(),
    );
    let mut bytes = (1_000_000u64).to_le_bytes().to_vec();
    bytes.extend(b"{}");
    src.write("model.safetensors", &bytes);
    let out = TempDir::new("conv-sthdr-out");
    let err = run_convert(src.path(), &out.path().join("x"), false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("1000000") && msg.contains("model.safetensors"),
        "{msg}"
    );
    assert!(entries(out.path()).is_empty());
}

#[test]
fn unknown_architecture_lists_the_supported_ones() {
    let src = TempDir::new("conv-unknown");
    let mut cfg = mixtral_config();
    cfg["model_type"] = "bert".into();
    write_hf(&src, &cfg, &mixtral_tensors());
    let out = TempDir::new("conv-unknown-out");
    let err = run_convert(src.path(), &out.path().join("x"), false).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("bert") && msg.contains("qwen3_moe") && msg.contains("gpt_oss"),
        "{msg}"
    );
    assert!(entries(out.path()).is_empty());

    let tmp = TempDir::new("conv-unknown-gguf");
    let mut b = llama_gguf();
    b.kvs[0].1 = V::str("mamba");
    let gsrc = tmp.write("m.gguf", &b.build());
    let msg = run_convert(&gsrc, &tmp.path().join("x"), false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("mamba") && msg.contains("qwen2"), "{msg}");
}

#[test]
fn wrong_shape_for_role_is_named_with_both_shapes() {
    let src = TempDir::new("conv-shape");
    let mut tensors = mixtral_tensors();
    for t in tensors.iter_mut() {
        if t.0 == "model.layers.1.self_attn.k_proj.weight" {
            t.1 = vec![KV * HEAD_DIM + 1, HIDDEN];
        }
    }
    write_hf(&src, &mixtral_config(), &tensors);
    let out = TempDir::new("conv-shape-out");
    let err = run_convert(src.path(), &out.path().join("x"), false).unwrap_err();
    match &err {
        FormatError::ShapeMismatch {
            tensor,
            expected,
            found,
            ..
        } => {
            assert_eq!(tensor, "blk.1.attn_k.weight");
            assert_eq!(expected, &vec![16, 32]);
            assert_eq!(found, &vec![17, 32]);
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }
    assert!(entries(out.path()).is_empty());
}

#[test]
fn missing_expert_is_reported() {
    let src = TempDir::new("conv-missing");
    let tensors: Vec<_> = mixtral_tensors()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.0.block_sparse_moe.experts.3.w2.weight")
        .collect();
    write_hf(&src, &mixtral_config(), &tensors);
    let out = TempDir::new("conv-missing-out");
    let err = run_convert(src.path(), &out.path().join("x"), false).unwrap_err();
    assert!(err.to_string().contains("blk.0.experts.3.down"), "{err}");
    assert!(entries(out.path()).is_empty());
}

#[test]
fn existing_destination_needs_force() {
    let tmp = TempDir::new("conv-force");
    let src = tmp.write("m.gguf", &llama_gguf().build());
    let dst = tmp.path().join("install");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("keep.txt"), b"user data").unwrap();
    let err = run_convert(&src, &dst, false).unwrap_err();
    assert!(
        matches!(err, FormatError::DestinationExists { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("--force"));
    assert_eq!(std::fs::read(dst.join("keep.txt")).unwrap(), b"user data");
    run_convert(&src, &dst, true).unwrap();
    assert!(!dst.join("keep.txt").exists());
    assert!(Install::open(&dst).is_ok());
    assert_eq!(entries(tmp.path()), vec!["install", "m.gguf"]);
}

/// gpt-oss experts: the MXFP4 blocks we write decode (with the reference
/// ggml-layout dequantizer) to exactly the values HF's own formula gives
/// for the checkpoint's `*_blocks`/`*_scales`, with gate = even rows and
/// up = odd rows of the fused tensor.
#[test]
fn gpt_oss_mxfp4_experts_decode_to_the_checkpoint_values() {
    use turbospark_core::quant::dequantize_row;
    use turbospark_format::safetensors::SafetensorsCheckpoint;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/gpt_oss");
    if !src.is_dir() {
        eprintln!("skipped: {} is absent", src.display());
        return;
    }
    let tmp = TempDir::new("conv-gptoss");
    let dst = tmp.path().join("install");
    run_convert(&src, &dst, false).unwrap();
    let install = Install::open(&dst).unwrap();
    let ckpt = SafetensorsCheckpoint::open_dir(&src).unwrap();
    // HF (integrations/mxfp4.py): byte j of a 16-byte group holds column
    // 2j in its low nibble and 2j+1 in its high nibble; value = FP4[code] *
    // 2^(scale - 127).
    const FP4: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let hf_row = |blocks: &[u8], scales: &[u8]| -> Vec<f32> {
        let mut out = Vec::new();
        for (g, &s) in scales.iter().enumerate() {
            let scale = 2f32.powi(s as i32 - 127);
            for b in &blocks[g * 16..g * 16 + 16] {
                out.push(FP4[(b & 15) as usize] * scale);
                out.push(FP4[(b >> 4) as usize] * scale);
            }
        }
        out
    };
    for (hf, parts) in [
        ("gate_up_proj", ["gate", "up"]),
        ("down_proj", ["down", "down"]),
    ] {
        let blocks_t = ckpt
            .tensor(&format!("model.layers.1.mlp.experts.{hf}_blocks"))
            .unwrap();
        let scales_t = ckpt
            .tensor(&format!("model.layers.1.mlp.experts.{hf}_scales"))
            .unwrap();
        let (blocks, scales) = (ckpt.tensor_bytes(blocks_t), ckpt.tensor_bytes(scales_t));
        let (e_count, rows, groups) = (
            blocks_t.shape[0] as usize,
            blocks_t.shape[1] as usize,
            blocks_t.shape[2] as usize,
        );
        let layer = install.manifest.expert_layer(1).unwrap();
        let file = std::fs::read(dst.join(&layer.file)).unwrap();
        for e in 0..e_count {
            for r in 0..rows {
                let base = (e * rows + r) * groups;
                let want = hf_row(
                    &blocks[base * 16..(base + groups) * 16],
                    &scales[base..base + groups],
                );
                let (part_name, row) = if parts[0] == parts[1] {
                    (parts[0], r)
                } else {
                    (parts[r % 2], r / 2)
                };
                let part = layer.part(part_name).unwrap();
                let row_bytes = groups * 17;
                let at = e * layer.stride as usize + part.offset as usize + row * row_bytes;
                let mut got = vec![0f32; groups * 32];
                dequantize_row(
                    turbospark_core::QuantFormat::Mxfp4,
                    &file[at..at + row_bytes],
                    &mut got,
                )
                .unwrap();
                // Compared as values: HF's code 8 is -0.0, ggml's is +0.0.
                assert_eq!(got, want, "{hf} expert {e} row {r}");
            }
        }
    }
}

#[test]
fn leftovers_of_a_killed_convert_are_removed_by_the_next_one() {
    let tmp = TempDir::new("conv-stale");
    let src = tmp.write("m.gguf", &llama_gguf().build());
    // A killed conversion's directory: no process has this pid.
    let stale = tmp.path().join(".install.partial-4000000000");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("resident.bin"), b"half").unwrap();
    run_convert(&src, &tmp.path().join("install"), false).unwrap();
    assert_eq!(entries(tmp.path()), vec!["install", "m.gguf"]);
}

/// A Mixtral language model wrapped as a conditional-generation checkpoint:
/// `model.language_model.*` beside a vision tower, a projector and MTP
/// layers.
fn mixtral_with_towers() -> Vec<(String, Vec<u64>)> {
    let mut t: Vec<(String, Vec<u64>)> = mixtral_tensors()
        .into_iter()
        .map(|(n, s)| match n.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), s),
            None => (n, s),
        })
        .collect();
    t.push(("model.vision_tower.patch_embed.weight".into(), vec![8, 12]));
    t.push((
        "model.vision_tower.blocks.0.attn.qkv.weight".into(),
        vec![24, 8],
    ));
    t.push((
        "model.multi_modal_projector.linear.weight".into(),
        vec![HIDDEN, 8],
    ));
    t.push((
        "mtp.layers.0.eh_proj.weight".into(),
        vec![HIDDEN, 2 * HIDDEN],
    ));
    t
}

#[test]
fn towers_projectors_and_mtp_layers_are_skipped_and_reported() {
    let src = TempDir::new("conv-towers");
    write_hf(&src, &mixtral_config(), &mixtral_with_towers());
    let out = TempDir::new("conv-towers-out");
    let dst = out.path().join("x");
    let manifest = convert(src.path(), &dst, ConvertOptions::default(), &mut |_| {}).unwrap();
    let skipped: Vec<(&str, usize, u64)> = manifest
        .skipped
        .iter()
        .map(|s| (s.part.as_str(), s.tensors, s.bytes))
        .collect();
    assert_eq!(
        skipped,
        vec![
            ("vision tower", 2, 4 * (8 * 12 + 24 * 8)),
            ("multimodal projector", 1, 4 * HIDDEN * 8),
            ("multi-token prediction layers", 1, 4 * HIDDEN * 2 * HIDDEN),
        ]
    );
    // The manifest on disk says the same, and the language model is whole.
    let install = Install::open(&dst).unwrap();
    assert_eq!(install.manifest.skipped, manifest.skipped);
    assert!(verify_install(&dst, &mut |_, _| {}).unwrap().all_ok());
}

#[test]
fn a_stray_tensor_beside_the_towers_is_still_refused() {
    let src = TempDir::new("conv-stray");
    let mut tensors = mixtral_with_towers();
    tensors.push(("model.mystery_tower.weight".into(), vec![4]));
    write_hf(&src, &mixtral_config(), &tensors);
    let out = TempDir::new("conv-stray-out");
    let err = run_convert(src.path(), &out.path().join("x"), false).unwrap_err();
    match &err {
        FormatError::UnexpectedTensor { tensor, .. } => {
            assert_eq!(tensor, "model.mystery_tower.weight")
        }
        other => panic!("expected an unexpected-tensor error, got {other}"),
    }
    assert!(entries(out.path()).is_empty());
}
