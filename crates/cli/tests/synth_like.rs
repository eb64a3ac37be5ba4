//! `turbospark synth --like`: random weights in exactly the layout of an
//! install made by `turbospark convert` (the reference: the converter's own
//! manifest and resident index), on every tiny HF fixture, the tiny
//! llama.cpp GGUFs (tokenizer and template files) and the real models where
//! they are cached. For each: every tensor's name, format, shape, offset
//! and length, the expert files (layers, parts, offsets, stride), the role
//! formats, tokenizer, template and generation defaults equal the
//! source's; every tensor's bytes differ from it; the install verifies and
//! `turbospark logits` gives finite, non-constant logits; and the layout
//! file (`--save-layout`) builds the same install, byte for byte, for the
//! same seed. Bad sources fail with a message naming the problem and leave
//! nothing at the destination.

mod common;

use common::{cache_dir, convert_to_temp, Work};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use turbospark_core::quant::dequantize_row;
use turbospark_format::install::Install;

const BIN: &str = env!("CARGO_BIN_EXE_turbospark");

const TINY_FAMILIES: &[&str] = &[
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

fn turbospark(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The stderr of a command that must fail.
fn fails(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every field of the manifest and index that describes the layout.
fn assert_same_layout(src: &Path, dst: &Path, tag: &str) {
    let (a, b) = (
        json(&src.join("manifest.json")),
        json(&dst.join("manifest.json")),
    );
    for key in [
        "format_version",
        "arch",
        "quant",
        "resident_bytes",
        "experts",
        "tokenizer",
        "chat_template",
        "generation",
        "skipped",
    ] {
        assert_eq!(a[key], b[key], "{tag}: manifest {key} differs");
    }
    let (ia, ib) = (
        json(&src.join("resident.index.json")),
        json(&dst.join("resident.index.json")),
    );
    let (ta, tb) = (
        ia["tensors"].as_array().unwrap(),
        ib["tensors"].as_array().unwrap(),
    );
    assert_eq!(ta.len(), tb.len(), "{tag}: tensor count");
    for (x, y) in ta.iter().zip(tb) {
        assert_eq!(x, y, "{tag}: resident tensor");
    }
    let files = |m: &Value| -> Vec<String> {
        let mut v: Vec<String> = m["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(&a), files(&b), "{tag}: files");
}

/// `path` → sha256 of the manifest's files.
fn hashes(dir: &Path) -> Vec<(String, String)> {
    let m = json(&dir.join("manifest.json"));
    let mut v: Vec<(String, String)> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// A float32 C-order `.npy` file: its shape and values.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
    };
    let header = std::str::from_utf8(&bytes[start..start + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let values = bytes[start + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, values)
}

/// The synthetic install `dst` against its source `src`: same layout, side
/// files copied, every weight different, verifies, finite logits.
fn check_against_source(src: &Path, dst: &Path, tag: &str, numerics: &str) {
    assert_same_layout(src, dst, tag);

    let (a, b) = (Install::open(src).unwrap(), Install::open(dst).unwrap());
    assert_eq!(b.manifest.source.kind, "synthetic", "{tag}");
    for t in &a.index.tensors {
        let (_, da) = a.tensor(&t.name).unwrap();
        let (_, db) = b.tensor(&t.name).unwrap();
        assert_ne!(da, db, "{tag}: tensor {} has the source's bytes", t.name);
    }
    for l in &a.manifest.experts {
        let fa = std::fs::read(a.expert_path(l)).unwrap();
        let fb = std::fs::read(b.expert_path(l)).unwrap();
        assert_eq!(fa.len(), fb.len(), "{tag}: {}", l.file);
        for e in [0, l.num_experts - 1] {
            for p in &l.parts {
                let at = (e as u64 * l.stride + p.offset) as usize;
                let range = at..at + p.length as usize;
                assert_ne!(
                    fa[range.clone()],
                    fb[range],
                    "{tag}: expert {e} part {} of layer {} has the source's bytes",
                    p.name,
                    l.layer
                );
            }
        }
    }
    let data = |path: &str| path.starts_with("resident") || path.starts_with("experts/");
    let (ha, hb) = (hashes(src), hashes(dst));
    for ((pa, sa), (_, sb)) in ha.iter().zip(&hb) {
        if data(pa) && pa != "resident.index.json" {
            assert_ne!(sa, sb, "{tag}: {pa} equals the source's");
        } else {
            assert_eq!(sa, sb, "{tag}: {pa} is not the source's copy");
        }
    }

    ok(
        &turbospark(&["verify", "-q", s(dst)]),
        &format!("{tag}: verify"),
    );
    let npy = dst.with_extension("npy");
    let vocab = b.manifest.arch.vocab_size;
    ok(
        &turbospark(&[
            "logits",
            "--model",
            s(dst),
            "--tokens",
            "1,2,3,4",
            "--numerics",
            numerics,
            "--out",
            s(&npy),
        ]),
        &format!("{tag}: logits"),
    );
    let (shape, values) = read_npy(&npy);
    assert_eq!(shape, [4, vocab], "{tag}: logits shape");
    assert!(
        values.iter().all(|v| v.is_finite()),
        "{tag}: non-finite logits"
    );
    let row0 = &values[..vocab];
    let spread = row0.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
        - row0.iter().fold(f32::INFINITY, |m, &v| m.min(v));
    assert!(spread > 0.0, "{tag}: constant logits");
    assert_ne!(&values[..vocab], &values[3 * vocab..], "{tag}: same rows");
}

/// `synth --like src` directly, and through a layout file with one thread:
/// both checked against the source, and byte-identical to each other.
fn check_like(src: &Path, work: &Path, tag: &str, numerics: &str) {
    let dst = work.join(format!("{tag}-like"));
    let via = work.join(format!("{tag}-via"));
    let layout = work.join(format!("{tag}.layout.json"));
    ok(
        &turbospark(&["synth", "-q", "--like", s(src), "--seed", "7", s(&dst)]),
        &format!("{tag}: synth --like"),
    );
    check_against_source(src, &dst, tag, numerics);
    ok(
        &turbospark(&["synth", "-q", "--like", s(src), "--save-layout", s(&layout)]),
        &format!("{tag}: --save-layout"),
    );
    assert!(std::fs::metadata(&layout).unwrap().len() < 32 << 20);
    ok(
        &turbospark(&[
            "synth",
            "-q",
            "--like",
            s(&layout),
            "--seed",
            "7",
            "--threads",
            "1",
            s(&via),
        ]),
        &format!("{tag}: synth --like FILE.json"),
    );
    assert_same_layout(src, &via, &format!("{tag} via layout file"));
    assert_eq!(hashes(&dst), hashes(&via), "{tag}: layout-file route");
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[test]
fn tiny_hf_fixtures() {
    let work = Work::new("ts-like-tiny");
    for family in TINY_FAMILIES {
        let src = work.0.join(format!("{family}-src"));
        ok(
            &turbospark(&[
                "convert",
                "-q",
                s(&fixtures().join("tiny").join(family)),
                s(&src),
            ]),
            &format!("{family}: convert"),
        );
        check_like(&src, &work.0, family, "exact");
    }
}

/// llama.cpp's q8_0 GGUFs: quantized matrices, a GGUF vocabulary and
/// generation defaults to copy.
#[test]
fn tiny_gguf_fixtures() {
    let work = Work::new("ts-like-gguf");
    for family in ["llama", "mixtral", "gemma4"] {
        let tag = format!("{family}-q8_0");
        let src = work.0.join(format!("{tag}-src"));
        let gguf = fixtures().join(format!("tiny-gguf/{family}.q8_0.gguf"));
        ok(
            &turbospark(&["convert", "-q", s(&gguf), s(&src)]),
            &format!("{tag}: convert"),
        );
        let m = json(&src.join("manifest.json"));
        assert!(m["tokenizer"].is_string(), "{tag}: no tokenizer to copy");
        check_like(&src, &work.0, &tag, "fast");
    }
}

/// The real models of scripts/fetch-models.sh, converted; skipped with a
/// message when absent (a failure when TURBOSPARK_REQUIRE_MODELS is set).
#[test]
fn real_models() {
    let work = Work::new("ts-like-real");
    for (stem, numerics) in [
        ("smollm2-135m-instruct-q4_1", "exact"),
        ("gemma3-270m-q4_k_m", "fast"),
    ] {
        let gguf = cache_dir().join("models").join(format!("{stem}.gguf"));
        if !gguf.is_file() {
            assert!(
                std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_none(),
                "{} is absent although TURBOSPARK_REQUIRE_MODELS is set",
                gguf.display()
            );
            eprintln!(
                "skipped {stem}: {} is absent (run scripts/fetch-models.sh)",
                gguf.display()
            );
            continue;
        }
        let src = convert_to_temp(&gguf, &format!("like-{stem}"));
        check_like(&src, &work.0, stem, numerics);
        let _ = std::fs::remove_dir_all(&src);
    }
}

/// With `--router-skew S` the router bias of each MoE layer is the log of a
/// Zipf popularity: sorted, `b_r − b_0 = −S · ln(r + 1)`.
#[test]
fn router_skew_follows_zipf() {
    let work = Work::new("ts-like-skew");
    let src = work.0.join("gpt_oss-src");
    let dst = work.0.join("gpt_oss-skew");
    ok(
        &turbospark(&[
            "convert",
            "-q",
            s(&fixtures().join("tiny/gpt_oss")),
            s(&src),
        ]),
        "convert",
    );
    ok(
        &turbospark(&[
            "synth",
            "-q",
            "--like",
            s(&src),
            "--router-skew",
            "1.5",
            s(&dst),
        ]),
        "synth --router-skew",
    );
    assert_same_layout(&src, &dst, "skew");
    let install = Install::open(&dst).unwrap();
    let moe_layers = install.manifest.experts.len();
    assert!(moe_layers > 0);
    for l in &install.manifest.experts {
        let (t, bytes) = install
            .tensor(&format!("blk.{}.ffn_gate_inp.bias", l.layer))
            .unwrap();
        let mut bias = vec![0.0f32; t.shape[0] as usize];
        dequantize_row(t.dtype, bytes, &mut bias).unwrap();
        bias.sort_by(|a, b| b.total_cmp(a));
        for (r, &b) in bias.iter().enumerate() {
            let want = -1.5 * ((r + 1) as f64).ln();
            assert!(
                (f64::from(b - bias[0]) - want).abs() < 1e-4,
                "layer {} rank {r}: {} vs {want}",
                l.layer,
                b - bias[0]
            );
        }
    }

    // A family without a router bias cannot carry the skew.
    let mixtral = work.0.join("mixtral-src");
    ok(
        &turbospark(&[
            "convert",
            "-q",
            s(&fixtures().join("tiny/mixtral")),
            s(&mixtral),
        ]),
        "convert mixtral",
    );
    let bad = work.0.join("mixtral-skew");
    let err = fails(
        &turbospark(&[
            "synth",
            "-q",
            "--like",
            s(&mixtral),
            "--router-skew",
            "1",
            s(&bad),
        ]),
        "skew without a router bias",
    );
    assert!(err.contains("router bias"), "{err}");
    assert!(!bad.exists());
}

/// Nothing but the destination's own name may appear in its parent.
fn assert_nothing_left(parent: &Path, name: &str) {
    for entry in std::fs::read_dir(parent).unwrap() {
        let n = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.contains(name), "{n} left behind");
    }
}

#[test]
fn bad_sources_are_clear_errors() {
    let work = Work::new("ts-like-bad");
    let src = work.0.join("src");
    ok(
        &turbospark(&[
            "convert",
            "-q",
            s(&fixtures().join("tiny/gpt_oss")),
            s(&src),
        ]),
        "convert",
    );
    let out_dir = work.0.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let dst = out_dir.join("dst");
    let layout = work.0.join("layout.json");
    ok(
        &turbospark(&[
            "synth",
            "-q",
            "--like",
            s(&src),
            "--save-layout",
            s(&layout),
        ]),
        "save layout",
    );
    let text = std::fs::read_to_string(&layout).unwrap();

    let try_layout = |tag: &str, text: &str, expect: &[&str]| {
        let file = work.0.join(format!("{tag}.json"));
        std::fs::write(&file, text).unwrap();
        let err = fails(
            &turbospark(&["synth", "-q", "--like", s(&file), s(&dst)]),
            tag,
        );
        for e in expect {
            assert!(err.contains(e), "{tag}: {err:?} should say {e:?}");
        }
        assert_nothing_left(&out_dir, "dst");
    };
    // An element format this build does not know.
    let mut v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["resident"][0]["name"], "token_embd.weight");
    v["resident"][0]["dtype"] = "q3_k".into();
    try_layout(
        "unknown-format",
        &v.to_string(),
        &["q3_k", "does not support", "token_embd.weight"],
    );
    // A tensor of a shape the architecture does not have.
    let mut v: Value = serde_json::from_str(&text).unwrap();
    let name = v["resident"][1]["name"].as_str().unwrap().to_string();
    v["resident"][1]["shape"][0] = 3.into();
    try_layout("bad-shape", &v.to_string(), &[&name]);
    // A quantized row that is not whole blocks.
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["experts"][0]["parts"][0]["dtype"] = "q4_k".into();
    try_layout("partial-blocks", &v.to_string(), &["q4_k", "blocks"]);
    // A file name escaping the install.
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["experts"][0]["file"] = "../../evil.bin".into();
    try_layout("escape", &v.to_string(), &["evil.bin"]);
    // Another version, and something that is not a layout at all.
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["turbospark_layout"] = 99.into();
    try_layout("version", &v.to_string(), &["version 99"]);
    try_layout(
        "not-layout",
        "{\"tensors\": []}",
        &["not a turbospark layout"],
    );
    // A GGUF file where an install or a layout was expected.
    try_layout(
        "gguf",
        "GGUF\u{3}\0\0\0",
        &["a GGUF file", "turbospark convert"],
    );

    // A broken install: a truncated expert file, then no resident.bin.
    let broken = work.0.join("broken");
    ok(
        &turbospark(&[
            "convert",
            "-q",
            s(&fixtures().join("tiny/gpt_oss")),
            s(&broken),
        ]),
        "convert",
    );
    let experts = broken.join("experts/000.bin");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&experts)
        .unwrap();
    f.set_len(100).unwrap();
    let err = fails(
        &turbospark(&["synth", "-q", "--like", s(&broken), s(&dst)]),
        "truncated expert file",
    );
    assert!(err.contains("000.bin"), "{err}");
    std::fs::remove_file(broken.join("resident.bin")).unwrap();
    let err = fails(
        &turbospark(&["synth", "-q", "--like", s(&broken), s(&dst)]),
        "missing resident.bin",
    );
    assert!(err.contains("resident.bin"), "{err}");
    let err = fails(
        &turbospark(&["synth", "-q", "--like", s(&work.0.join("nowhere")), s(&dst)]),
        "missing source",
    );
    assert!(err.contains("nowhere"), "{err}");
    assert_nothing_left(&out_dir, "dst");

    // The gpt-oss dimension options do not mix with --like; an existing
    // destination needs --force.
    let err = fails(
        &turbospark(&["synth", "--like", s(&src), "--layers", "2", s(&dst)]),
        "--like with --layers",
    );
    assert!(err.contains("--layers"), "{err}");
    ok(
        &turbospark(&["synth", "-q", "--like", s(&src), s(&dst)]),
        "synth",
    );
    let err = fails(
        &turbospark(&["synth", "-q", "--like", s(&src), s(&dst)]),
        "existing destination",
    );
    assert!(err.contains("--force"), "{err}");
    ok(
        &turbospark(&["synth", "-q", "--like", s(&src), "--force", s(&dst)]),
        "synth --force",
    );
}
