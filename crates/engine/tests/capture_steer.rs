//! Residual capture and steering against HF transformers 5.24.0.
//!
//! The references are written by `scripts/fixtures/make_tiny.py`
//! (`write_probe_references`) next to each tiny fixture: `hidden_states.npy`
//! (HF `output_hidden_states`, `hidden_states[L + 1]` = output of decoder
//! layer `L`, `[n_tokens, n_layers, hidden]`) and the logits of forward hooks
//! on one layer that add `s·u`, project `u` out, or clamp the component
//! along `u` (`steer_*_logits.npy`). Everything runs in exact numerics, and
//! must agree to `max|Δ| / max|ref| ≤ 1e-4` per row.

mod common;

use common::TempInstall;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::{
    CapturedRows, ControlVector, EngineError, Model, ResidualSink, SessionOptions, SteerMode,
    Steering,
};

const TOLERANCE: f64 = 1e-4;
const FAMILIES: &[&str] = &["llama", "gemma3", "gpt_oss", "mixtral", "gemma4"];

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(family)
}

/// A float32 C-order `.npy` file: its shape and values.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
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

fn tokens(family: &str) -> Vec<u32> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(family).join("tokens.json")).unwrap())
            .unwrap();
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Worst `max|a − b| / max|b|` over rows of `width`; panics past the
/// tolerance.
fn compare(what: &str, ours: &[f32], reference: &[f32], width: usize) -> f64 {
    assert_eq!(ours.len(), reference.len(), "{what}: lengths");
    let mut worst = 0f64;
    for (row, (a, b)) in ours
        .chunks_exact(width)
        .zip(reference.chunks_exact(width))
        .enumerate()
    {
        let scale = b.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = a.iter().zip(b).fold(0f64, |m, (&x, &y)| {
            m.max((f64::from(x) - f64::from(y)).abs())
        });
        let rel = diff / scale.max(f64::MIN_POSITIVE);
        assert!(
            rel <= TOLERANCE,
            "{what}: row {row}: max|Δ|/max|ref| = {rel:.3e} > {TOLERANCE:e}"
        );
        worst = worst.max(rel);
    }
    worst
}

/// Collects captured rows in memory, checking that positions follow on.
#[derive(Clone, Default)]
struct Collect {
    rows: Arc<Mutex<Vec<f32>>>,
    tokens: Arc<Mutex<Vec<u32>>>,
    finished: Arc<Mutex<bool>>,
}

impl ResidualSink for Collect {
    fn write(&mut self, r: &CapturedRows<'_>) -> std::io::Result<()> {
        let mut t = self.tokens.lock().unwrap();
        assert_eq!(r.data.len(), r.tokens.len() * r.layers.len() * r.hidden);
        t.extend_from_slice(r.tokens);
        self.rows.lock().unwrap().extend_from_slice(r.data);
        Ok(())
    }
    fn finish(self: Box<Self>) -> std::io::Result<()> {
        *self.finished.lock().unwrap() = true;
        Ok(())
    }
}

fn load(install: &TempInstall) -> Model<CpuDevice> {
    let device = CpuDevice::new(2).unwrap().with_numerics(Numerics::Exact);
    Model::load(&install.open(), device).unwrap()
}

#[test]
fn captured_residuals_match_hf_hidden_states() {
    for &family in FAMILIES {
        let hs_path = fixture(family).join("hidden_states.npy");
        let Some(install) = TempInstall::convert(family, "capture") else {
            panic!("fixture {family} is absent");
        };
        let (shape, hf) = read_npy(&hs_path);
        let model = load(&install);
        let toks = tokens(family);
        let (n, layers, hidden) = (shape[0], shape[1], shape[2]);
        assert_eq!(
            (n, layers, hidden),
            (
                toks.len(),
                model.spec().layers.len(),
                model.spec().hidden_size
            )
        );
        let all: Vec<usize> = (0..layers).collect();

        // One prefill in chunks of 7 (rows cross chunk boundaries), and
        // token by token.
        for (what, max_batch, decode) in [("prefill", 7, false), ("decode", 64, true)] {
            let sink = Collect::default();
            let mut s = model
                .session(SessionOptions {
                    context: n,
                    max_batch,
                })
                .unwrap();
            s.set_capture(&all, Box::new(sink.clone())).unwrap();
            if decode {
                for (pos, &t) in toks.iter().enumerate() {
                    s.decode(t, pos).unwrap();
                }
            } else {
                let mut logits = vec![0f32; n * model.vocab_size()];
                s.prefill(&toks, &mut logits).unwrap();
            }
            s.finish_capture().unwrap();
            assert!(*sink.finished.lock().unwrap());
            assert_eq!(*sink.tokens.lock().unwrap(), toks);
            let rows = sink.rows.lock().unwrap();
            let worst = compare(&format!("{family} {what}"), &rows, &hf, hidden);
            println!("{family:>8} {what}: max rel error vs HF hidden_states {worst:.2e}");
        }

        // A subset of layers, in the order asked.
        let pick = [layers - 1, 0];
        let sink = Collect::default();
        let mut s = model.session(SessionOptions::new(n)).unwrap();
        s.set_capture(&pick, Box::new(sink.clone())).unwrap();
        let mut logits = vec![0f32; n * model.vocab_size()];
        s.prefill(&toks, &mut logits).unwrap();
        let want: Vec<f32> = (0..n)
            .flat_map(|t| {
                pick.iter()
                    .flat_map(move |&l| (0..hidden).map(move |i| (t * layers + l) * hidden + i))
            })
            .map(|i| hf[i])
            .collect();
        compare(
            &format!("{family} layers {pick:?}"),
            &sink.rows.lock().unwrap(),
            &want,
            hidden,
        );
    }
}

struct SteerRef {
    layer: usize,
    scale: f32,
    clamp: f32,
    u: Vec<f32>,
}

fn steer_ref(family: &str) -> SteerRef {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture(family).join("steer.json")).unwrap())
            .unwrap();
    SteerRef {
        layer: v["layer"].as_u64().unwrap() as usize,
        scale: v["scale"].as_f64().unwrap() as f32,
        clamp: v["clamp"].as_f64().unwrap() as f32,
        u: read_npy(&fixture(family).join("steer_direction.npy")).1,
    }
}

#[test]
fn steering_matches_hf_forward_hooks() {
    for &family in FAMILIES {
        let install = TempInstall::convert(family, "steer").expect("fixture");
        let model = load(&install);
        let toks = tokens(family);
        let n = toks.len();
        let vocab = model.vocab_size();
        let hidden = model.spec().hidden_size;
        let r = steer_ref(family);
        let mut cv = ControlVector::new(hidden);
        cv.set(r.layer, r.u.clone()).unwrap();
        for (mode, scale, file) in [
            (SteerMode::Add, r.scale, "steer_add_logits.npy"),
            (SteerMode::Ablate, 1.0, "steer_ablate_logits.npy"),
            (SteerMode::Clamp, r.clamp, "steer_clamp_logits.npy"),
        ] {
            let (_, hf) = read_npy(&fixture(family).join(file));
            let steering = Steering {
                mode,
                vectors: vec![(cv.clone(), scale)],
                layer_range: None,
            };
            let mut s = model
                .session(SessionOptions {
                    context: n,
                    max_batch: 5,
                })
                .unwrap();
            s.set_steering(Some(&steering)).unwrap();
            // Capture the steered layer: ablate leaves no component along
            // u, clamp leaves exactly the clamp value.
            let sink = Collect::default();
            s.set_capture(&[r.layer], Box::new(sink.clone())).unwrap();
            let mut logits = vec![0f32; n * vocab];
            s.prefill(&toks, &mut logits).unwrap();
            let worst = compare(&format!("{family} {mode:?}"), &logits, &hf, vocab);
            println!(
                "{family:>8} {mode:?} at layer {}: max rel error vs HF hook {worst:.2e}",
                r.layer
            );
            let rows = sink.rows.lock().unwrap();
            for (t, h) in rows.chunks_exact(hidden).enumerate() {
                let dot: f64 = h
                    .iter()
                    .zip(&r.u)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let norm = h.iter().map(|&a| f64::from(a).powi(2)).sum::<f64>().sqrt();
                let target = match mode {
                    SteerMode::Ablate => 0.0,
                    SteerMode::Clamp => f64::from(r.clamp),
                    SteerMode::Add => continue,
                };
                assert!(
                    (dot - target).abs() <= 1e-5 * (1.0 + norm),
                    "{family} {mode:?}: position {t}: component {dot}, expected {target}"
                );
            }

            // Steering off again gives back the fixture's own logits.
            s.reset();
            s.set_steering(None).unwrap();
            s.finish_capture().unwrap();
            s.prefill(&toks, &mut logits).unwrap();
            let (_, base) = read_npy(&fixture(family).join("logits.npy"));
            compare(&format!("{family} unsteered"), &logits, &base, vocab);
        }
    }
}

#[test]
fn steering_outside_the_layer_range_does_nothing_and_bad_input_is_refused() {
    let install = TempInstall::convert("llama", "steer-range").expect("fixture");
    let model = load(&install);
    let toks = tokens("llama");
    let (n, vocab, hidden) = (toks.len(), model.vocab_size(), model.spec().hidden_size);
    let n_layers = model.spec().layers.len();
    let r = steer_ref("llama");
    let mut cv = ControlVector::new(hidden);
    cv.set(r.layer, r.u.clone()).unwrap();
    let mut s = model.session(SessionOptions::new(n)).unwrap();

    // A range that leaves the vector's layer out.
    let steering = Steering {
        mode: SteerMode::Add,
        vectors: vec![(cv.clone(), r.scale)],
        layer_range: Some((r.layer + 1, n_layers - 1)),
    };
    s.set_steering(Some(&steering)).unwrap();
    let mut logits = vec![0f32; n * vocab];
    s.prefill(&toks, &mut logits).unwrap();
    let (_, base) = read_npy(&fixture("llama").join("logits.npy"));
    compare("llama out of range", &logits, &base, vocab);

    // Two vectors add up: half the scale twice is the whole scale.
    s.reset();
    let steering = Steering {
        mode: SteerMode::Add,
        vectors: vec![(cv.clone(), r.scale / 2.0), (cv.clone(), r.scale / 2.0)],
        layer_range: Some((r.layer, r.layer)),
    };
    s.set_steering(Some(&steering)).unwrap();
    s.prefill(&toks, &mut logits).unwrap();
    let (_, hf) = read_npy(&fixture("llama").join("steer_add_logits.npy"));
    compare("llama two halves", &logits, &hf, vocab);

    // Bad input: a typed error, and the session keeps working.
    let bad_range = Steering {
        layer_range: Some((1, n_layers)),
        ..steering.clone()
    };
    assert!(matches!(
        s.set_steering(Some(&bad_range)),
        Err(EngineError::SteeringLayerRange { .. })
    ));
    let reversed = Steering {
        layer_range: Some((1, 0)),
        ..steering.clone()
    };
    assert!(matches!(
        s.set_steering(Some(&reversed)),
        Err(EngineError::SteeringLayerRange { .. })
    ));
    let mut narrow = ControlVector::new(hidden - 1);
    narrow.set(1, vec![0.0; hidden - 1]).unwrap();
    let wrong_width = Steering {
        vectors: vec![(narrow, 1.0)],
        ..steering.clone()
    };
    assert!(matches!(
        s.set_steering(Some(&wrong_width)),
        Err(EngineError::ControlVectorWidth { .. })
    ));
    let mut deep = ControlVector::new(hidden);
    deep.set(n_layers, vec![0.0; hidden]).unwrap();
    let too_deep = Steering {
        vectors: vec![(deep, 1.0)],
        layer_range: None,
        ..steering.clone()
    };
    assert!(matches!(
        s.set_steering(Some(&too_deep)),
        Err(EngineError::ControlVectorLayer { .. })
    ));
    assert!(matches!(
        s.set_capture(&[n_layers], Box::new(Collect::default())),
        Err(EngineError::CaptureLayer { .. })
    ));
    assert!(matches!(
        s.set_capture(&[1, 1], Box::new(Collect::default())),
        Err(EngineError::CaptureRepeat { .. })
    ));
    s.reset();
    s.prefill(&toks, &mut logits).unwrap();
    compare("llama after refusals", &logits, &hf, vocab);
}
