//! Every tiny HF fixture (tests/fixtures/tiny, made by
//! scripts/fixtures/make_tiny.py with transformers 5.24.0) converts,
//! verifies, and `inspect --json` reports the dimensions its config.json
//! states. The expected values are read from config.json here, independently
//! of the converter's own config parsing.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_turbospark")
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny")
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("turbospark-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn first_u64(cfg: &Value, keys: &[&str]) -> Option<u64> {
    keys.iter()
        .find_map(|k| cfg.get(*k).and_then(Value::as_u64))
}

fn check_fixture(dir: &Path, work: &Path) {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let top: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let cfg = top
        .get("text_config")
        .filter(|v| v.is_object())
        .unwrap_or(&top);
    let dst = work.join(&name);
    let (code, _, err) = run(&[
        "convert",
        "-q",
        dir.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{name}: convert failed: {err}");
    let (code, out, err) = run(&["verify", "-q", dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{name}: verify failed: {out}{err}");
    let (code, out, err) = run(&["inspect", "--json", dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{name}: inspect failed: {err}");
    let j: Value = serde_json::from_str(&out).unwrap();
    let arch = &j["arch"];
    let layers = arch["layers"].as_array().unwrap();
    let u = |v: &Value| v.as_u64().unwrap();

    assert_eq!(
        u(&arch["hidden_size"]),
        u(&cfg["hidden_size"]),
        "{name} hidden"
    );
    assert_eq!(
        layers.len() as u64,
        u(&cfg["num_hidden_layers"]),
        "{name} layers"
    );
    assert_eq!(
        u(&arch["num_heads"]),
        u(&cfg["num_attention_heads"]),
        "{name} heads"
    );
    assert_eq!(
        u(&arch["vocab_size"]),
        u(&cfg["vocab_size"]),
        "{name} vocab"
    );
    if let Some(r) = first_u64(cfg, &["kv_lora_rank"]) {
        // Latent attention: one cached KV head of `[k_rope, c]` per
        // position; the config's own head widths sit in `arch.mla`.
        let mla = &arch["mla"];
        for key in [
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        ] {
            assert_eq!(mla[key], cfg[key], "{name} {key}");
        }
        let rope = u(&cfg["qk_rope_head_dim"]);
        assert_eq!(u(&arch["num_kv_heads"]), 1, "{name} latent kv heads");
        assert_eq!(u(&arch["head_dim"]), r + rope, "{name} latent head_dim");
    } else {
        if let Some(kv) = first_u64(cfg, &["num_key_value_heads"]) {
            assert_eq!(u(&arch["num_kv_heads"]), kv, "{name} kv heads");
        }
        if let Some(hd) = first_u64(cfg, &["head_dim"]) {
            assert_eq!(u(&arch["head_dim"]), hd, "{name} head_dim");
        }
    }
    if let Some(e) = first_u64(
        cfg,
        &["num_local_experts", "num_experts", "n_routed_experts"],
    ) {
        assert_eq!(u(&arch["moe"]["num_experts"]), e, "{name} experts");
        let k = first_u64(cfg, &["num_experts_per_tok", "top_k_experts"]).unwrap();
        assert_eq!(u(&arch["moe"]["top_k"]), k, "{name} top_k");
        let n_moe = layers.iter().filter(|l| l["ffn"] == "moe").count();
        assert_eq!(
            j["expert_layers"].as_array().unwrap().len(),
            n_moe,
            "{name} expert files"
        );
    }
    if let Some(types) = cfg.get("layer_types").and_then(Value::as_array) {
        let window = cfg.get("sliding_window").and_then(Value::as_u64);
        for (i, (t, l)) in types.iter().zip(layers).enumerate() {
            let want = if t == "sliding_attention" {
                window
            } else {
                None
            };
            assert_eq!(l["window"].as_u64(), want, "{name} layer {i} window");
        }
    }
    if let Some(k_heads) = first_u64(cfg, &["linear_num_key_heads"]) {
        // Gated DeltaNet: its widths, and which layers it mixes.
        let d = &arch["delta_net"];
        assert_eq!(u(&d["k_heads"]), k_heads, "{name} DeltaNet key heads");
        for (key, field) in [
            ("linear_num_value_heads", "v_heads"),
            ("linear_key_head_dim", "k_head_dim"),
            ("linear_value_head_dim", "v_head_dim"),
            ("linear_conv_kernel_dim", "conv_kernel"),
        ] {
            assert_eq!(d[field], cfg[key], "{name} {key}");
        }
        let types = cfg["layer_types"].as_array().unwrap();
        for (i, (t, l)) in types.iter().zip(layers).enumerate() {
            let want = match t.as_str() {
                Some("linear_attention") => Value::from("delta_net"),
                _ => Value::Null,
            };
            assert_eq!(l["mixer"], want, "{name} layer {i} mixer");
        }
    }
    if let Some(overrides) = cfg.get("per_layer_config").and_then(Value::as_object) {
        for (i, o) in overrides {
            let l = &layers[i.parse::<usize>().unwrap()];
            assert_eq!(l["head_dim"], o["head_dim"], "{name} layer {i} head_dim");
            assert_eq!(
                l["num_kv_heads"], o["num_key_value_heads"],
                "{name} layer {i} kv heads"
            );
        }
    }
    if let Some(dense) = cfg.get("mlp_only_layers").and_then(Value::as_array) {
        for d in dense {
            assert_eq!(
                layers[d.as_u64().unwrap() as usize]["ffn"],
                "dense",
                "{name} mlp_only"
            );
        }
    }
    if let Some(k) = first_u64(cfg, &["first_k_dense_replace"]) {
        for (i, l) in layers.iter().enumerate() {
            let want = if (i as u64) < k { "dense" } else { "moe" };
            assert_eq!(l["ffn"], want, "{name} layer {i} ffn");
        }
    }
}

#[test]
fn tiny_fixtures_convert_verify_and_inspect_to_their_config() {
    let root = fixtures_dir();
    let mut dirs: Vec<PathBuf> = match std::fs::read_dir(&root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("config.json").is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixtures under {}", root.display());
    let work = tmp_dir("tiny");
    for d in &dirs {
        check_fixture(d, &work);
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn verify_names_a_damaged_file_and_fails() {
    let src = fixtures_dir().join("mixtral");
    if !src.is_dir() {
        eprintln!("skipped: {} is absent", src.display());
        return;
    }
    let work = tmp_dir("damaged");
    let dst = work.join("m");
    let (code, _, err) = run(&[
        "convert",
        "-q",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let f = dst.join("experts/001.bin");
    let mut b = std::fs::read(&f).unwrap();
    b[17] ^= 1;
    std::fs::write(&f, b).unwrap();
    let (code, out, err) = run(&["verify", dst.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("experts/001.bin"), "{err}");
    let (code, _, err) = run(&[
        "convert",
        "-q",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");
    let _ = std::fs::remove_dir_all(&work);
}
