//! Every command that runs a model takes `--numerics exact|llama-cpp|fast`:
//! `logits` (the parity tool) defaults to `exact`, the others to `fast`.

use std::process::Command;

fn help(command: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([command, "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{command} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn defaults_per_command() {
    for (command, default) in [
        ("logits", "exact"),
        ("run", "fast"),
        ("chat", "fast"),
        ("bench", "fast"),
    ] {
        let h = help(command);
        let at = h
            .find("--numerics")
            .unwrap_or_else(|| panic!("{command} has no --numerics: {h}"));
        let section = &h[at..];
        let end = section.find("\n  -").unwrap_or(section.len());
        let section = &section[..end];
        assert!(
            section.contains(&format!("[default: {default}]")),
            "{command}: {section}"
        );
        for value in ["exact", "llama-cpp", "fast"] {
            assert!(
                section.contains(value),
                "{command} misses {value}: {section}"
            );
        }
    }
}

#[test]
fn unknown_numerics_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "run",
            "--model",
            "x",
            "--prompt",
            "y",
            "--numerics",
            "quick",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quick") && err.contains("llama-cpp"), "{err}");
}
