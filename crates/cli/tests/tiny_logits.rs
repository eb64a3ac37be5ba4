//! Logits of every tiny HF fixture against HF transformers 5.24.0.
//!
//! For each family in `tests/fixtures/tiny/<family>/` (config.json,
//! model.safetensors, tokens.json and the eager-attention `logits.npy` that
//! scripts/fixtures/make_tiny.py recorded with transformers), the binary
//! converts the checkpoint, computes the logits in one prefill and token by
//! token (`--decode`), and both must satisfy, at every position:
//!
//! - `max|ours − hf| / max|hf| ≤ 1e-4`, and
//! - the same argmax;
//!
//! and decode must agree with prefill to the same tolerance (and with HF's
//! own cached decode, `decode_logits.npy`, where the fixture has it: the
//! recurrent families). MoE families
//! are run once more with streamed experts in top_k slots, which must match
//! HF the same way and the default logits bit for bit. The reference is
//! HF's output, independent of this code.

use std::path::{Path, PathBuf};
use std::process::Command;

const TOLERANCE: f64 = 1e-4;

/// Families whose fixtures must be present.
const REQUIRED: &[&str] = &["llama", "qwen2", "gemma3", "muse_glimmer", "gemma4"];
const FAMILIES: &[&str] = &[
    "llama",
    "qwen2",
    "gemma3",
    "muse_glimmer",
    "mixtral",
    "qwen3moe",
    "gpt_oss",
    "glm4_moe",
    "gemma4",
    "deepseek_v3",
    "qwen3_5_moe",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny")
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A float32 C-order `.npy` file: its shape and values.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        &bytes[..6],
        b"\x93NUMPY",
        "{}: not an npy file",
        path.display()
    );
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap();
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data: Vec<f32> = bytes[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(
        data.len(),
        shape.iter().product::<usize>(),
        "{}",
        path.display()
    );
    (shape, data)
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Worst `max|a − b| / max|b|` over positions; panics on an argmax change
/// or a position past the tolerance.
fn compare(family: &str, what: &str, ours: &[f32], reference: &[f32], vocab: usize) -> f64 {
    let mut worst = 0f64;
    for (pos, (a, b)) in ours
        .chunks_exact(vocab)
        .zip(reference.chunks_exact(vocab))
        .enumerate()
    {
        let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = a.iter().zip(b).fold(0f64, |m, (&x, &y)| {
            m.max((f64::from(x) - f64::from(y)).abs())
        });
        let rel = diff / scale.max(f64::MIN_POSITIVE);
        assert!(
            rel <= TOLERANCE,
            "{family} {what}: position {pos}: max|Δ|/max|logit| = {rel:.3e} > {TOLERANCE:e}"
        );
        assert_eq!(
            argmax(a),
            argmax(b),
            "{family} {what}: argmax differs at position {pos}"
        );
        worst = worst.max(rel);
    }
    worst
}

#[test]
fn tiny_fixtures_match_hf_logits() {
    let work = std::env::temp_dir().join(format!("turbospark-tiny-logits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let mut checked = Vec::new();
    for &family in FAMILIES {
        let dir = fixtures().join(family);
        if !dir.join("logits.npy").is_file() {
            assert!(
                !REQUIRED.contains(&family),
                "fixture {family} is required but absent"
            );
            println!("skipped {family}: fixture absent");
            continue;
        }
        let tokens: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("tokens.json")).unwrap()).unwrap();
        let tokens: Vec<String> = tokens["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap().to_string())
            .collect();
        let tokens = tokens.join(",");
        let install = work.join(family);
        let install_s = install.to_str().unwrap();
        run(&["convert", "-q", dir.to_str().unwrap(), install_s])
            .unwrap_or_else(|e| panic!("{family}: convert failed: {e}"));
        let prefill_path = work.join(format!("{family}.prefill.npy"));
        let decode_path = work.join(format!("{family}.decode.npy"));
        let prefill = run(&[
            "logits",
            "--model",
            install_s,
            "--tokens",
            &tokens,
            "--out",
            prefill_path.to_str().unwrap(),
        ]);
        prefill.unwrap_or_else(|e| panic!("{family}: logits failed: {e}"));
        run(&[
            "logits",
            "--model",
            install_s,
            "--tokens",
            &tokens,
            "--out",
            decode_path.to_str().unwrap(),
            "--decode",
        ])
        .unwrap_or_else(|e| panic!("{family}: logits --decode failed: {e}"));

        let (hf_shape, hf) = read_npy(&dir.join("logits.npy"));
        let (shape, ours) = read_npy(&prefill_path);
        let (dshape, decoded) = read_npy(&decode_path);
        assert_eq!(shape, hf_shape, "{family}: logits shape");
        assert_eq!(dshape, hf_shape, "{family}: decode logits shape");
        let vocab = hf_shape[1];
        let vs_hf = compare(family, "prefill vs HF", &ours, &hf, vocab);
        let decode_vs_hf = compare(family, "decode vs HF", &decoded, &hf, vocab);
        let decode_vs_prefill = compare(family, "decode vs prefill", &decoded, &ours, vocab);
        println!(
            "{family:>13}: max rel error vs HF {vs_hf:.2e} (decode {decode_vs_hf:.2e}), decode vs prefill {decode_vs_prefill:.2e}"
        );
        // Families with a recurrent state also carry HF's own cached decode.
        let hf_decode_path = dir.join("decode_logits.npy");
        if hf_decode_path.is_file() {
            let (s, hf_decode) = read_npy(&hf_decode_path);
            assert_eq!(s, hf_shape, "{family}: HF decode logits shape");
            let d = compare(family, "decode vs HF decode", &decoded, &hf_decode, vocab);
            println!("{family:>13}: decode vs HF's cached decode {d:.2e}");
        }

        // Streamed experts in the fewest slots: against HF too, and bit for
        // bit the default (resident) logits.
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(install.join("manifest.json")).unwrap()).unwrap();
        if let Some(top_k) = manifest["arch"]["moe"]["top_k"].as_u64() {
            let streamed_path = work.join(format!("{family}.streamed.npy"));
            run(&[
                "logits",
                "--model",
                install_s,
                "--tokens",
                &tokens,
                "--out",
                streamed_path.to_str().unwrap(),
                "--experts",
                "streamed",
                "--expert-slots",
                &top_k.to_string(),
            ])
            .unwrap_or_else(|e| panic!("{family}: logits --experts streamed failed: {e}"));
            let (_, streamed) = read_npy(&streamed_path);
            let vs_hf = compare(family, "streamed vs HF", &streamed, &hf, vocab);
            assert!(
                streamed
                    .iter()
                    .zip(&ours)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{family}: streamed logits differ from resident"
            );
            println!("{family:>13}: streamed ({top_k} slots) identical, vs HF {vs_hf:.2e}");
        }
        checked.push(family);
    }
    let _ = std::fs::remove_dir_all(&work);
    for f in REQUIRED {
        assert!(checked.contains(f), "{f} was not checked");
    }
}
