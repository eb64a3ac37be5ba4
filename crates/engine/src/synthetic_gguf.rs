//! A synthetic gpt-oss model as a GGUF file that llama.cpp loads, holding
//! the same random weights [`write_synthetic_install`] would write for the
//! same spec and options, so the two engines can be raced on identical
//! bytes: `turbospark convert` of this file gives that install's tensors.
//!
//! The file is what llama.cpp's `convert_hf_to_gguf.py` writes for gpt-oss
//! (`conversion/gpt_oss.py`, `gguf-py/gguf/constants.py`
//! `MODEL_ARCH.GPT_OSS`, read back by `src/models/openai-moe.cpp`):
//! architecture `gpt-oss`; the `gpt-oss.*` hyper-parameters of
//! `TextModel.set_gguf_parameters` plus `attention.sliding_window` and
//! `expert_feed_forward_length`; resident tensors under llama.cpp's names
//! (the pre-FFN norm is `post_attention_norm`); routed experts stacked per
//! layer as `ffn_{gate,up,down}_exps.{weight,bias}` `[n_expert, ...]`, the
//! matrices MXFP4 (ggml's `block_mxfp4`, as the install stores them). Other
//! matrices are the synth's resident format (Q8_0 by default), vectors f32.
//!
//! The vocabulary is a minimal GPT-2 byte-level BPE (`tokenizer.ggml.model
//! = gpt2`, pre-tokenizer `gpt-4o` as gpt-oss's): the 256 byte tokens, then
//! filler tokens up to the model's vocabulary size, the last one
//! `<|endoftext|>` (a control token, EOS), no merges. Any text tokenizes
//! (to bytes), which is all a benchmark needs.
//!
//! [`write_synthetic_install`]: crate::synthetic_install::write_synthetic_install

use crate::synthetic_install::{
    check_router_skew, generate_experts, generate_resident, layouts, SynthEvent, SynthOptions,
};
use crate::EngineError;
use std::path::Path;
use turbospark_core::arch::RopeScaling;
use turbospark_core::{ArchSpec, QuantFormat};
use turbospark_format::families;
use turbospark_format::gguf::{GgufArray, GgufValue};
use turbospark_format::gguf_writer::{GgufTensorDecl, GgufWriter};
use turbospark_format::identity::gguf_from_canonical;
use turbospark_format::roles::{expected_resident, GGUF_EXPERT_STACKS};

/// The GGUF architecture written: llama.cpp's name for gpt-oss.
const ARCHITECTURE: &str = "gpt-oss";
/// llama.cpp's `LLAMA_FTYPE_MOSTLY_MXFP4_MOE`.
const FILE_TYPE_MXFP4_MOE: u32 = 38;
/// llama.cpp's token types (`llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
/// Byte tokens plus the end-of-text token.
const MIN_VOCAB: usize = 257;

/// GPT-2's byte-level alphabet: the character each byte is written as.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut next = 256;
    (0u32..256)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER)
        })
        .collect()
}

/// The `tokenizer.ggml.*` metadata of the minimal vocabulary.
fn vocab_metadata(vocab: usize) -> Vec<(String, GgufValue)> {
    let mut tokens: Vec<String> = byte_chars().into_iter().map(String::from).collect();
    tokens.extend((tokens.len()..vocab - 1).map(|i| format!("<|synth_{i}|>")));
    tokens.push("<|endoftext|>".into());
    let mut types = vec![TOKEN_NORMAL; vocab];
    types[vocab - 1] = TOKEN_CONTROL;
    let eos = (vocab - 1) as u32;
    let kv = |k: &str, v: GgufValue| (format!("tokenizer.ggml.{k}"), v);
    vec![
        kv("model", GgufValue::String("gpt2".into())),
        kv("pre", GgufValue::String("gpt-4o".into())),
        kv("tokens", GgufValue::Array(GgufArray::String(tokens))),
        kv("token_type", GgufValue::Array(GgufArray::I32(types))),
        kv("merges", GgufValue::Array(GgufArray::String(Vec::new()))),
        kv("bos_token_id", GgufValue::U32(eos)),
        kv("eos_token_id", GgufValue::U32(eos)),
        kv("padding_token_id", GgufValue::U32(eos)),
        kv("add_bos_token", GgufValue::Bool(false)),
    ]
}

/// The `general.*` and `gpt-oss.*` metadata of `spec`.
fn model_metadata(spec: &ArchSpec, seed: u64) -> Result<Vec<(String, GgufValue)>, EngineError> {
    let bad = |detail: String| EngineError::BadOptions { detail };
    let moe = spec
        .moe
        .as_ref()
        .ok_or_else(|| bad("a gpt-oss GGUF needs routed experts".into()))?;
    let first = spec
        .layers
        .first()
        .ok_or_else(|| bad("a gpt-oss GGUF needs at least one layer".into()))?;
    let rope = first
        .rope
        .ok_or_else(|| bad("gpt-oss layers use rope".into()))?;
    let window = spec
        .layers
        .iter()
        .find_map(|l| l.window)
        .ok_or_else(|| bad("gpt-oss alternates sliding-window layers".into()))?;
    let u = |v: usize| GgufValue::U32(v as u32);
    let a = |k: &str, v: GgufValue| (format!("gpt-oss.{k}"), v);
    let mut meta = vec![
        (
            "general.architecture".to_string(),
            GgufValue::String(ARCHITECTURE.into()),
        ),
        (
            "general.name".to_string(),
            GgufValue::String(format!("turbospark synthetic gpt-oss, seed {seed}")),
        ),
        (
            "general.file_type".to_string(),
            GgufValue::U32(FILE_TYPE_MXFP4_MOE),
        ),
        a("context_length", u(spec.max_position)),
        a("embedding_length", u(spec.hidden_size)),
        a("feed_forward_length", u(moe.expert_intermediate)),
        a("block_count", u(spec.num_layers())),
        a("attention.head_count", u(spec.num_heads)),
        a("attention.head_count_kv", u(spec.num_kv_heads)),
        a("rope.freq_base", GgufValue::F32(rope.theta)),
        a(
            "attention.layer_norm_rms_epsilon",
            GgufValue::F32(spec.norms.attn_input.eps),
        ),
        a("expert_count", u(moe.num_experts)),
        a("expert_used_count", u(moe.top_k)),
        a("attention.key_length", u(spec.head_dim)),
        a("attention.value_length", u(spec.head_dim)),
    ];
    if let RopeScaling::Yarn {
        factor,
        original_max_position,
        ..
    } = rope.scaling
    {
        meta.push(a("rope.scaling.type", GgufValue::String("yarn".into())));
        meta.push(a("rope.scaling.factor", GgufValue::F32(factor)));
        meta.push(a(
            "rope.scaling.original_context_length",
            u(original_max_position),
        ));
    }
    meta.push(a("attention.sliding_window", u(window)));
    meta.push(a("expert_feed_forward_length", u(moe.expert_intermediate)));
    Ok(meta)
}

/// Writes the GGUF of a random gpt-oss model of `spec` at `path` (see the
/// module docs); `opts.force` replaces an existing file.
pub fn write_synthetic_gguf(
    spec: &ArchSpec,
    path: &Path,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(SynthEvent),
) -> Result<(), EngineError> {
    // The family such a file reads back as.
    let experts = spec.moe.as_ref().map_or(0, |m| m.num_experts as u64);
    let writes = families::for_gguf(ARCHITECTURE, experts).map(|d| d.family());
    if writes.as_ref() != Some(&spec.family) {
        return Err(EngineError::BadOptions {
            detail: format!(
                "a synthetic GGUF is written for gpt-oss models only, not {}",
                families::name(&spec.family)
            ),
        });
    }
    if spec.vocab_size < MIN_VOCAB {
        return Err(EngineError::BadOptions {
            detail: format!(
                "a synthetic GGUF needs a vocabulary of at least {MIN_VOCAB} tokens (256 bytes \
                 and end-of-text), got {}",
                spec.vocab_size
            ),
        });
    }
    check_router_skew(spec, opts)?;
    let family = &spec.family;
    let matrix_format = |shape: &[u64]| match shape {
        [_, cols] if cols % opts.resident_format.block_elems() as u64 == 0 => opts.resident_format,
        _ => QuantFormat::F32,
    };
    let resident = expected_resident(spec);
    let mut decls: Vec<GgufTensorDecl> = resident
        .iter()
        .map(|t| GgufTensorDecl {
            name: gguf_from_canonical(family, &t.name),
            shape: t.shape.clone(),
            format: matrix_format(&t.shape),
        })
        .collect();
    let layouts = layouts(spec, opts.expert_format);
    // (layer, part) → the stacked tensor's name.
    let stack_name = |layer: usize, part: &str| {
        GGUF_EXPERT_STACKS
            .iter()
            .find(|(p, _)| *p == part)
            .map(|(_, suffix)| format!("blk.{layer}.{suffix}"))
            .ok_or_else(|| EngineError::BadOptions {
                detail: format!("expert part {part} has no GGUF tensor"),
            })
    };
    for layout in layouts.values() {
        for p in &layout.parts {
            let mut shape = vec![layout.num_experts as u64];
            shape.extend(&p.shape);
            decls.push(GgufTensorDecl {
                name: stack_name(layout.layer, &p.name)?,
                shape,
                format: p.dtype,
            });
        }
    }
    let mut meta = model_metadata(spec, opts.seed)?;
    meta.extend(vocab_metadata(spec.vocab_size));
    let mut writer = GgufWriter::create(path, &meta, decls, opts.force)?;

    let mut done = 0;
    generate_resident(spec, opts, &mut |name, _, _, bytes| {
        writer.write_tensor(&gguf_from_canonical(family, name), &bytes)?;
        done += 1;
        progress(SynthEvent::Resident {
            done,
            total: resident.len(),
            bytes: 0,
            total_bytes: 0,
        });
        Ok(())
    })?;

    let total: u64 = layouts
        .values()
        .map(|l| l.parts.iter().map(|p| p.length).sum::<u64>() * l.num_experts as u64)
        .sum();
    let mut written = 0u64;
    for layout in layouts.values() {
        let names: Vec<String> = layout
            .parts
            .iter()
            .map(|p| stack_name(layout.layer, &p.name))
            .collect::<Result<_, _>>()?;
        generate_experts(layout, opts, &mut |e, parts| {
            for ((p, name), bytes) in layout.parts.iter().zip(&names).zip(parts) {
                writer.write_at(name, e as u64 * p.length, &bytes)?;
                written += bytes.len() as u64;
            }
            progress(SynthEvent::Experts {
                bytes: written,
                total,
            });
            Ok(())
        })?;
    }
    writer.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_is_gpt2s() {
        let c = byte_chars();
        assert_eq!(c.len(), 256);
        assert_eq!(c[b'a' as usize], 'a');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        let unique: std::collections::HashSet<char> = c.iter().copied().collect();
        assert_eq!(unique.len(), 256);
    }
}
