//! `turbospark logits` with the expert options: the plan line, `--stats`,
//! `--router-hist`, and bad input (too few slots, a short expert file),
//! which must fail with a message naming the problem and leave no output
//! file; `synth --router-skew` and `bench` on the result.

mod common;

use common::Work;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(family: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(family);
    dir.join("model.safetensors").is_file().then_some(dir)
}

fn turbospark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .unwrap()
}

/// A converted `family` install in a fresh work directory.
fn install(family: &str, tag: &str) -> Option<(Work, PathBuf)> {
    let src = fixture(family)?;
    let work = std::env::temp_dir().join(format!("ts-cli-experts-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let dst = work.join(family);
    let out = turbospark(&[
        "convert",
        "-q",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((Work(work), dst))
}

const TOKENS: &str = "1,5,9,13,17,21,25,29,33,37";

#[test]
fn stats_and_router_histogram() {
    let Some((work, model)) = install("glm4_moe", "stats") else {
        return;
    };
    let out = work.0.join("x.npy");
    let hist = work.0.join("hist.json");
    let o = turbospark(&[
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        TOKENS,
        "--out",
        out.to_str().unwrap(),
        "--experts",
        "streamed",
        "--expert-slots",
        "3",
        "--expert-cache",
        "lru",
        "--stats",
        "--router-hist",
        hist.to_str().unwrap(),
        "--decode",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("experts streamed: 3 slots per layer, lru cache"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hit rate") && stderr.contains("total"),
        "{stderr}"
    );
    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&hist).unwrap()).unwrap();
    let top_k = h["top_k"].as_u64().unwrap();
    assert_eq!(top_k, 3);
    let layers = h["layers"].as_array().unwrap();
    // glm4_moe's first layer is dense.
    assert_eq!(layers.len(), 2);
    for l in layers {
        let counts = l["counts"].as_array().unwrap();
        assert_eq!(counts.len(), h["num_experts"].as_u64().unwrap() as usize);
        let sum: u64 = counts.iter().map(|c| c.as_u64().unwrap()).sum();
        assert_eq!(sum, 10 * top_k);
        assert_eq!(l["total"].as_u64().unwrap(), sum);
    }
    assert_eq!(h["total"].as_u64().unwrap(), 2 * 10 * top_k);
}

#[test]
fn bad_expert_input_fails_cleanly_without_output() {
    let Some((work, model)) = install("mixtral", "bad") else {
        return;
    };
    let out = work.0.join("x.npy");
    let logits = |extra: &[&str]| {
        let mut args = vec![
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--tokens",
            TOKENS,
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        turbospark(&args)
    };
    let o = logits(&["--expert-slots", "1"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("use at least 2"), "{stderr}");
    assert!(!out.exists());

    let o = logits(&["--memory-budget", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--memory-budget"));

    let expert_file = model.join("experts").read_dir().unwrap().next().unwrap();
    let expert_file = expert_file.unwrap().path();
    let len = std::fs::metadata(&expert_file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&expert_file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let o = logits(&["--experts", "streamed", "--expert-slots", "2"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    let name = expert_file.file_name().unwrap().to_str().unwrap();
    assert!(stderr.contains(name), "{stderr}");
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(&work.0).unwrap().count(),
        1,
        "only the install is in the work directory"
    );
}

/// `synth` (with a router skew) then `bench` on it: one row per slot
/// count, the routing line, and a histogram whose every layer counts
/// (prompt + generate) × top_k selections.
#[test]
fn synth_with_router_skew_then_bench() {
    let work = Work(std::env::temp_dir().join(format!("ts-cli-bench-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&work.0);
    std::fs::create_dir_all(&work.0).unwrap();
    let model = work.0.join("synth");
    let dims = [
        "--layers",
        "2",
        "--experts",
        "8",
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
        "256",
    ];
    let mut args = vec![
        "synth",
        model.to_str().unwrap(),
        "-q",
        "--router-skew",
        "1.0",
    ];
    args.extend(dims);
    let out = turbospark(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let hist = work.0.join("hist.json");
    let out = turbospark(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "5",
        "--generate",
        "3",
        "--router-hist",
        hist.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Slots k, 2k, 4k, all = 2, 4, 8 (4k = all: one row).
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("streamed"))
        .collect();
    let slots: Vec<&str> = rows
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(slots, ["2", "4", "8"], "{stdout}");
    assert!(rows.iter().all(|r| r.ends_with("yes")), "{stdout}");
    assert!(
        stdout.contains("routing: each layer's most chosen 2 / 4 / 8"),
        "{stdout}"
    );

    let h: serde_json::Value = serde_json::from_slice(&std::fs::read(&hist).unwrap()).unwrap();
    assert_eq!(h["num_experts"], 8);
    assert_eq!(h["top_k"], 2);
    let layers = h["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2);
    for l in layers {
        let counts: Vec<u64> = l["counts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(counts.iter().sum::<u64>(), (5 + 3) * 2, "{l}");
    }
    assert_eq!(h["total"], 2 * (5 + 3) * 2);
}

#[test]
fn synth_refuses_a_negative_router_skew() {
    let dst = std::env::temp_dir().join(format!("ts-cli-badskew-{}", std::process::id()));
    let out = turbospark(&[
        "synth",
        dst.to_str().unwrap(),
        "-q",
        "--router-skew=-1",
        "--layers",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("router skew") && err.contains("-1"), "{err}");
    assert!(!dst.exists(), "a refused synth left {}", dst.display());
}
