//! `--capture-resid` and `--control-vector` through the binary, on the
//! tiny llama fixture, against the HF references that
//! scripts/fixtures/make_tiny.py commits (`hidden_states.npy`: HF
//! `output_hidden_states`; `steer_add_logits.npy`: a forward hook adding
//! `scale · u` to one layer's output). Bad control vectors and layer
//! ranges must fail with a message, not a panic.

mod common;

use common::Work;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use turbospark_engine::ControlVector;

const TOLERANCE: f64 = 1e-4;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama")
}

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) {
    let out = bin(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + hlen) % 64, 0, "data aligned");
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    let shape: Vec<usize> = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data: Vec<f32> = bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(data.len(), shape.iter().product::<usize>());
    (shape, data)
}

fn max_rel(ours: &[f32], reference: &[f32], width: usize) -> f64 {
    assert_eq!(ours.len(), reference.len());
    ours.chunks_exact(width)
        .zip(reference.chunks_exact(width))
        .map(|(a, b)| {
            let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
            let d = a.iter().zip(b).fold(0f64, |m, (&x, &y)| {
                m.max((f64::from(x) - f64::from(y)).abs())
            });
            d / scale
        })
        .fold(0.0, f64::max)
}

#[test]
fn capture_and_steering_from_the_command_line() {
    let work = Work::new("turbospark-capture-cli");
    let install = work.0.join("llama");
    let install_s = install.to_str().unwrap();
    ok(&["convert", "-q", fixture().to_str().unwrap(), install_s]);
    let tokens: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("tokens.json")).unwrap()).unwrap();
    let ids: Vec<u64> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let tokens_arg = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");

    // Capture every layer, and a range of layers.
    let (hs_shape, hs) = read_npy(&fixture().join("hidden_states.npy"));
    let (n, layers, hidden) = (hs_shape[0], hs_shape[1], hs_shape[2]);
    let cap = work.0.join("resid.npy");
    let logits = work.0.join("logits.npy");
    let (cap_s, logits_s) = (cap.to_str().unwrap(), logits.to_str().unwrap());
    ok(&[
        "logits",
        "--model",
        install_s,
        "--tokens",
        &tokens_arg,
        "--out",
        logits_s,
        "--capture-resid",
        cap_s,
    ]);
    let (shape, got) = read_npy(&cap);
    assert_eq!(shape, hs_shape);
    let rel = max_rel(&got, &hs, hidden);
    assert!(rel <= TOLERANCE, "capture vs HF hidden_states: {rel:e}");
    let side: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.0.join("resid.json")).unwrap()).unwrap();
    assert_eq!(side["token_ids"], tokens["tokens"]);
    assert_eq!(side["shape"], serde_json::json!([n, layers, hidden]));
    assert_eq!(side["positions"].as_array().unwrap().len(), n);

    let last = layers - 1;
    ok(&[
        "logits",
        "--model",
        install_s,
        "--tokens",
        &tokens_arg,
        "--out",
        logits_s,
        "--capture-resid",
        cap_s,
        "--capture-layers",
        &format!("1-{last}"),
    ]);
    let (shape, got) = read_npy(&cap);
    assert_eq!(shape, vec![n, layers - 1, hidden]);
    let want: Vec<f32> = (0..n)
        .flat_map(|t| {
            (1..layers).flat_map(move |l| (0..hidden).map(move |i| (t * layers + l) * hidden + i))
        })
        .map(|i| hs[i])
        .collect();
    assert!(max_rel(&got, &want, hidden) <= TOLERANCE);

    // Steering with a control vector file written in llama.cpp's format.
    let steer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("steer.json")).unwrap()).unwrap();
    let layer = steer["layer"].as_u64().unwrap() as usize;
    let scale = steer["scale"].as_f64().unwrap();
    let (_, u) = read_npy(&fixture().join("steer_direction.npy"));
    let mut cv = ControlVector::new(hidden);
    cv.set(layer, u).unwrap();
    let cv_path = work.0.join("v.gguf");
    cv.write_gguf(&cv_path, "llama").unwrap();
    let cv_arg = format!("{}:{scale}", cv_path.display());
    ok(&[
        "logits",
        "--model",
        install_s,
        "--tokens",
        &tokens_arg,
        "--out",
        logits_s,
        "--control-vector",
        &cv_arg,
    ]);
    let (lshape, got) = read_npy(&logits);
    let (_, hf) = read_npy(&fixture().join("steer_add_logits.npy"));
    let rel = max_rel(&got, &hf, lshape[1]);
    assert!(rel <= TOLERANCE, "steered logits vs HF hook: {rel:e}");

    // Bad input: a clear error, exit status 2, no panic.
    let not_gguf = work.0.join("bad.gguf");
    std::fs::write(&not_gguf, b"definitely not gguf").unwrap();
    for (args, needle) in [
        (
            vec!["--control-vector", not_gguf.to_str().unwrap()],
            "not a GGUF file",
        ),
        (
            vec![
                "--control-vector",
                &cv_arg,
                "--control-vector-layer-range",
                "2",
                "1",
            ],
            "layer range",
        ),
        (
            vec![
                "--control-vector",
                &cv_arg,
                "--control-vector-layer-range",
                "0",
                "99",
            ],
            "layer range",
        ),
        (
            vec!["--capture-resid", cap_s, "--capture-layers", "0-99"],
            "not within",
        ),
    ] {
        let mut all = vec![
            "logits",
            "--model",
            install_s,
            "--tokens",
            &tokens_arg,
            "--out",
            logits_s,
        ];
        all.extend(args.iter().copied());
        let out = bin(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // A control vector for another width.
    let mut narrow = ControlVector::new(hidden + 1);
    narrow.set(1, vec![0.0; hidden + 1]).unwrap();
    narrow.write_gguf(&not_gguf, "llama").unwrap();
    let out = bin(&[
        "logits",
        "--model",
        install_s,
        "--tokens",
        &tokens_arg,
        "--out",
        logits_s,
        "--control-vector",
        not_gguf.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("hidden size"), "{err}");
}
