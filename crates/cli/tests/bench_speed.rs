//! `turbospark bench` speed mode (llama-bench's tests) on a dense install
//! (the tiny llama fixture, converted) and a MoE one (a tiny `synth`):
//! one JSON line per test with the fields outside scripts parse, the
//! markdown table, and clear errors for bad options.

mod common;

use common::Work;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_turbospark");

fn turbospark(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn dense_install(work: &Work) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
    let dst = work.0.join("llama");
    let out = turbospark(&[
        "convert",
        "-q",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dst
}

fn moe_install(work: &Work) -> PathBuf {
    let dst = work.0.join("synth");
    let out = turbospark(&[
        "synth",
        dst.to_str().unwrap(),
        "-q",
        "--layers",
        "2",
        "--experts",
        "4",
        "--top-k",
        "2",
        "--hidden",
        "64",
        "--expert-intermediate",
        "64",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--head-dim",
        "32",
        "--vocab",
        "128",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dst
}

fn json_lines(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn dense_json_has_one_line_per_test() {
    let work = Work::new("ts-bench-speed-dense");
    let model = dense_install(&work);
    let out = turbospark(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8,0",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "--numerics",
        "exact,fast",
        "--json",
    ]);
    let rows = json_lines(&out);
    let tests: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["numerics"].as_str().unwrap()))
        .collect();
    assert_eq!(
        tests,
        [
            ("pp8", "exact"),
            ("tg4", "exact"),
            ("pp8", "fast"),
            ("tg4", "fast")
        ]
    );
    for r in &rows {
        assert_eq!(r["threads"], 1);
        assert_eq!(r["backend"], "CPU");
        assert_eq!(r["model"], "llama");
        assert_eq!(r["repetitions"], 2);
        assert_eq!(r["samples"].as_array().unwrap().len(), 2);
        assert!(r["tok_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["sd"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["model_n_params"].as_u64().unwrap() > 0, "{r}");
        assert!(r["model_size"].as_u64().unwrap() > 0, "{r}");
        assert!(r["experts"].is_null(), "{r}");
        let pp = r["test"] == "pp8";
        assert_eq!(r["n_prompt"], if pp { 8 } else { 0 });
        assert_eq!(r["n_gen"], if pp { 0 } else { 4 });
        if cfg!(target_os = "linux") {
            assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0, "{r}");
        }
    }
}

/// `-d` repeats every test after a prefill of that many tokens, in
/// llama-bench's order (depth outermost) and with its names.
#[test]
fn depths_repeat_each_test_after_a_prefill() {
    let work = Work::new("ts-bench-speed-depth");
    let model = dense_install(&work);
    let out = turbospark(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "4",
        "-n",
        "3",
        "-d",
        "0,6",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
    ]);
    let rows = json_lines(&out);
    let got: Vec<(&str, u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
                r["n_depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("pp4", 4, 0, 0),
            ("tg3", 0, 3, 0),
            ("pp4 @ d6", 4, 0, 6),
            ("tg3 @ d6", 0, 3, 6)
        ]
    );
    assert!(rows.iter().all(|r| r["tok_per_s"].as_f64().unwrap() > 0.0));
}

#[test]
fn moe_table_and_long_options() {
    let work = Work::new("ts-bench-speed-moe");
    let model = moe_install(&work);
    let out = turbospark(&[
        "bench",
        "--model",
        model.to_str().unwrap(),
        "--n-prompt",
        "5",
        "--n-gen",
        "0",
        "--repetitions",
        "1",
        "--threads",
        "2",
        "--experts",
        "streamed",
        "--expert-slots",
        "2",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "header, rule, one test: {stdout}");
    assert!(
        lines[0].contains("| model") && lines[0].contains("t/s") && lines[0].contains("numerics"),
        "{stdout}"
    );
    assert!(lines[1].starts_with("| ---"), "{stdout}");
    let cells: Vec<&str> = lines[2].split('|').map(str::trim).collect();
    // "", model, size, params, backend, threads, numerics, test, t/s, peak RSS, ""
    assert!(cells[1].starts_with("gpt-oss "), "{stdout}");
    assert_eq!(&cells[4..8], ["CPU", "2", "fast", "pp5"], "{stdout}");
    assert!(cells[8].contains(" ± "), "{stdout}");
    assert!(
        text(&out.stderr).contains("experts streamed: 2 slots"),
        "{}",
        text(&out.stderr)
    );

    let out = turbospark(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "0",
        "-n",
        "3",
        "-r",
        "1",
        "--json",
    ]);
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["test"], "tg3");
    assert_eq!(rows[0]["experts"], "resident");
}

#[test]
fn bad_options_are_clear_errors() {
    let work = Work::new("ts-bench-speed-bad");
    let model = dense_install(&work);
    let m = model.to_str().unwrap();
    for (args, want) in [
        (vec!["-p", "0", "-n", "0"], "nothing to run"),
        (vec!["-r", "0"], "--repetitions must be at least 1"),
        (vec!["-t", "0"], "--threads must be at least 1"),
        (vec!["--sweep"], "needs a MoE install"),
    ] {
        let mut all = vec!["bench", "-m", m];
        all.extend(&args);
        let out = turbospark(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = turbospark(&["bench", "-m", "/nonexistent/install"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("manifest.json"),
        "{}",
        text(&out.stderr)
    );
}
