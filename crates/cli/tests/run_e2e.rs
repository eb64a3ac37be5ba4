//! End to end: `turbospark run` on SmolLM2-135M-Instruct (Q4_1 GGUF,
//! converted into a temporary install) answers a factual question greedily,
//! and bad input gets a clear error. The model tests skip, saying why, when
//! the GGUF is not cached (`scripts/fetch-models.sh smollm2` fetches it),
//! unless `TURBOSPARK_REQUIRE_MODELS` is set.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_turbospark");
const QUESTION: &str = "What is the capital of France?";

fn cached_gguf() -> Option<PathBuf> {
    let p = common::cache_dir().join("models/smollm2-135m-instruct-q4_1.gguf");
    p.is_file().then_some(p)
}

fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("run-e2e-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The converted install, made once per test process; `None` (after saying
/// why) when the model is not cached.
fn install() -> Option<&'static Path> {
    static INSTALL: OnceLock<Option<PathBuf>> = OnceLock::new();
    INSTALL
        .get_or_init(|| {
            let Some(gguf) = cached_gguf() else {
                if std::env::var_os("TURBOSPARK_REQUIRE_MODELS").is_some() {
                    panic!(
                        "TURBOSPARK_REQUIRE_MODELS is set but smollm2-135m-instruct-q4_1.gguf \
                         is not cached; run scripts/fetch-models.sh smollm2"
                    );
                }
                eprintln!(
                    "skipped: smollm2-135m-instruct-q4_1.gguf is not cached \
                     (scripts/fetch-models.sh smollm2 fetches it)"
                );
                return None;
            };
            let dst = scratch_dir("install").join("smollm2");
            let out = Command::new(BIN)
                .arg("convert")
                .arg(&gguf)
                .arg(&dst)
                .arg("--force")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "convert failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(dst)
        })
        .as_deref()
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).arg("run").args(args).output().unwrap()
}

/// `run` asking QUESTION of the install at `dir`, greedily, at most 32
/// tokens, with `extra` arguments. Exact numerics: the answer's first token
/// is a near tie that f32 arithmetic gives to "The" (…Paris) and 8-bit
/// activations give to "L" (llama.cpp's "L'Étoile, ...", ahead by 0.09
/// nats; `fast` answers the same).
fn ask_greedily(dir: &Path, extra: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    let mut args = vec![
        "--model",
        dir,
        "--prompt",
        QUESTION,
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "--numerics",
        "exact",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn greedy_answer_names_paris() {
    let Some(dir) = install() else { return };
    let out = ask_greedily(dir, &["--timings"]);
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    assert!(answer.contains("Paris"), "answer: {answer:?}");
    let err = stderr(&out);
    assert!(
        err.contains("prompt ") && err.contains("tok/s") && err.contains("peak RSS"),
        "summary: {err}"
    );
    // --timings: a table whose sections (prefill, decode) sum to their
    // wall time, with the engine's phases, the sampler, the detokenizer
    // and what no phase claimed.
    let generated: usize = err
        .split("generated ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in the summary: {err}"));
    let table: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("timings "))
        .collect();
    assert!(!table.is_empty(), "no timings table: {err}");
    let ms = |line: &str| -> f64 {
        line[26..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    for (section, tokens) in [("prefill", None), ("decode", Some(generated - 1))] {
        let head = table
            .iter()
            .position(|l| l.starts_with(section))
            .unwrap_or_else(|| panic!("no {section} row: {err}"));
        if let Some(n) = tokens {
            assert!(
                table[head].contains(&format!("({n} tokens)")),
                "{}",
                table[head]
            );
        }
        let rows: Vec<&str> = table[head + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .copied()
            .collect();
        let names: Vec<&str> = rows.iter().map(|r| r[..26].trim()).collect();
        // SmolLM2 is dense: no router, no routed experts.
        for phase in ["attention", "dense FFN", "head", "unaccounted"] {
            assert!(
                names.contains(&phase),
                "{phase} missing in {section}: {names:?}"
            );
        }
        assert!(!names.contains(&"router"), "{names:?}");
        if section == "decode" {
            assert!(names.contains(&"sampling") && names.contains(&"detokenize"));
        }
        let sum: f64 = rows.iter().map(|r| ms(r)).sum();
        let wall = ms(table[head]);
        assert!(
            (sum - wall).abs() <= 0.001 * rows.len() as f64 + 1e-9,
            "{section}: rows sum to {sum} ms, wall {wall} ms"
        );
    }
    assert!(table.iter().any(|l| l.starts_with("template + tokenize")));
    assert!(table.iter().any(|l| l.starts_with("wall")));
}

#[test]
fn stop_string_is_not_printed() {
    let Some(dir) = install() else { return };
    let out = ask_greedily(dir, &["--stop", "Paris"]);
    assert!(out.status.success(), "run failed: {}", stderr(&out));
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(!answer.contains("Paris"), "answer: {answer:?}");
    assert!(
        stderr(&out).contains("stop: stop string"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn install_without_tokenizer_is_a_clear_error() {
    let Some(dir) = install() else { return };
    let bare = scratch_dir("notok");
    std::fs::copy(dir.join("manifest.json"), bare.join("manifest.json")).unwrap();
    let out = run(&["--model", bare.to_str().unwrap(), "--prompt", QUESTION]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("has no tokenizer"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&bare);
}

#[test]
fn prompt_longer_than_context_is_a_clear_error() {
    let Some(dir) = install() else { return };
    let prompt = "hello ".repeat(100);
    let out = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        &prompt,
        "--context",
        "64",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("but the context holds 64 positions") && err.contains("--context"),
        "{err}"
    );
}

/// A KV cache larger than memory is a typed error (exit 2), not an abort.
#[test]
fn context_larger_than_memory_is_a_clear_error() {
    let Some(dir) = install() else { return };
    let out = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        "hello",
        "--context",
        "4000000000",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("KV cache") && err.contains("needs") && err.contains("bytes"),
        "{err}"
    );
}

#[test]
fn invalid_utf8_prompt_file_names_file_and_offset() {
    // Checked before the model is opened: needs no model.
    let d = scratch_dir("utf8");
    let file = d.join("prompt.txt");
    std::fs::write(&file, b"abc\xff\xfedef").unwrap();
    let out = run(&[
        "--model",
        d.to_str().unwrap(),
        "--prompt-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("prompt.txt") && err.contains("not valid UTF-8") && err.contains("offset 3"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn missing_chat_template_suggests_raw() {
    let Some(dir) = install() else { return };
    let d = scratch_dir("notmpl");
    for f in ["manifest.json", "vocab.gguf.json"] {
        std::fs::copy(dir.join(f), d.join(f)).unwrap();
    }
    // The manifest names the template; a missing file means no template.
    let out = run(&["--model", d.to_str().unwrap(), "--prompt", QUESTION]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no chat template") && err.contains("--raw"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
