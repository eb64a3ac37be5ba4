//! Batched decoding of several sequences ([`Session::decode_batch`]) for
//! every family's ArchSpec on random weights: each sequence, decoded in a
//! batch whose members come and go, gets bit for bit the logits it gets
//! when it runs alone in a session of its own (prefill, then one token at a
//! time), in exact and in fast numerics. The reference is the single-sequence
//! path, which `sessions.rs` checks against one whole prefill.

mod common;

use common::{model_as, spec, FAMILIES};
use turbospark_core::QuantFormat;
use turbospark_cpu::Numerics;
use turbospark_engine::{
    BatchRow, ControlVector, EngineError, Logits, SessionOptions, SteerMode, Steering,
};

/// Prompt lengths of the three sequences and the step each joins at.
const PROMPTS: [(usize, usize); 3] = [(5, 0), (9, 0), (3, 2)];
const STEPS: usize = 7;
const CONTEXT: usize = 32;

fn prompt(seq: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 31 + seq * 101 + 7) % vocab) as u32)
        .collect()
}

/// The token fed at decode step `step` of sequence `seq`.
fn fed(seq: usize, step: usize, vocab: usize) -> u32 {
    ((step * 53 + seq * 17 + 3) % vocab) as u32
}

/// A control vector on layer 1 (a pseudo-random direction), in `mode`.
fn steering(hidden: usize, mode: SteerMode) -> Steering {
    let mut cv = ControlVector::new(hidden);
    for layer in 1..2 {
        let u: Vec<f32> = (0..hidden)
            .map(|i| (((i * 37 + layer * 11) % 17) as f32 - 8.0) / 8.0)
            .collect();
        let norm = u.iter().map(|v| v * v).sum::<f32>().sqrt();
        cv.set(layer, u.iter().map(|v| v / norm).collect()).unwrap();
    }
    Steering {
        mode,
        vectors: vec![(cv, 0.5)],
        layer_range: None,
    }
}

#[test]
fn batched_decode_equals_each_sequence_alone() {
    check_batched_decode(None);
}

/// Steering acts on every row of a batch as on a sequence alone (the
/// server's `--control-vector`).
#[test]
fn steered_batched_decode_equals_each_sequence_alone() {
    check_batched_decode(Some(SteerMode::Add));
    check_batched_decode(Some(SteerMode::Ablate));
}

fn check_batched_decode(steer: Option<SteerMode>) {
    for numerics in [Numerics::Exact, Numerics::Fast] {
        for &family in FAMILIES {
            let Some(spec) = spec(family, &[]) else {
                println!("skipped {family}: fixture absent");
                continue;
            };
            let format = match numerics {
                Numerics::Exact => QuantFormat::F32,
                _ => QuantFormat::Q8_0,
            };
            let m = model_as(&spec, 2, format, numerics);
            let vocab = spec.vocab_size;
            let steering = steer.map(|mode| steering(spec.hidden_size, mode));

            // Alone: logits after the prompt, then after each fed token.
            let alone: Vec<Vec<Vec<f32>>> = PROMPTS
                .iter()
                .enumerate()
                .map(|(seq, &(len, _))| {
                    let mut s = m.session(SessionOptions::new(CONTEXT)).unwrap();
                    s.set_steering(steering.as_ref()).unwrap();
                    let mut last = vec![0f32; vocab];
                    s.forward(0, &prompt(seq, len, vocab), Logits::Last(&mut last))
                        .unwrap();
                    let mut out = vec![last];
                    for step in 0..STEPS {
                        let pos = s.position();
                        out.push(s.decode(fed(seq, step, vocab), pos).unwrap().to_vec());
                    }
                    out
                })
                .collect();

            // Batched: one worker session, a cache per sequence; a
            // sequence joins (prefill) at its step and leaves when done.
            let mut worker = m.session(SessionOptions::new(CONTEXT)).unwrap();
            worker.set_steering(steering.as_ref()).unwrap();
            let mut caches: Vec<_> = PROMPTS
                .iter()
                .map(|_| worker.new_cache().unwrap())
                .collect();
            let mut steps_done = [0usize; 3];
            let mut logits = vec![0f32; PROMPTS.len() * vocab];
            for step in 0..STEPS + 2 {
                for (seq, &(len, join)) in PROMPTS.iter().enumerate() {
                    if join == step {
                        let mut last = vec![0f32; vocab];
                        worker
                            .forward_in(
                                &mut caches[seq],
                                &prompt(seq, len, vocab),
                                Logits::Last(&mut last),
                            )
                            .unwrap();
                        assert_eq!(
                            last, alone[seq][0],
                            "{family} {numerics:?}: prefill of {seq}"
                        );
                    }
                }
                let members: Vec<usize> = (0..PROMPTS.len())
                    .filter(|&s| PROMPTS[s].1 <= step && steps_done[s] < STEPS)
                    .collect();
                if members.is_empty() {
                    continue;
                }
                let mut rows: Vec<BatchRow<'_, _>> = caches
                    .iter_mut()
                    .enumerate()
                    .filter(|(s, _)| members.contains(s))
                    .map(|(s, kv)| BatchRow {
                        kv,
                        token: fed(s, steps_done[s], vocab),
                    })
                    .collect();
                let out = &mut logits[..members.len() * vocab];
                worker.decode_batch(&mut rows, out).unwrap();
                for (i, &s) in members.iter().enumerate() {
                    steps_done[s] += 1;
                    assert_eq!(
                        &out[i * vocab..(i + 1) * vocab],
                        &alone[s][steps_done[s]][..],
                        "{family} {numerics:?}: sequence {s}, step {}",
                        steps_done[s]
                    );
                }
            }
            assert_eq!(steps_done, [STEPS; 3], "{family}");
            // The worker's own cache was never touched.
            assert_eq!(worker.position(), 0, "{family}");
        }
    }
}

#[test]
fn batched_decode_checks_its_inputs() {
    let spec = spec("llama", &[]).expect("llama fixture");
    let m = model_as(&spec, 1, QuantFormat::F32, Numerics::Exact);
    let vocab = spec.vocab_size;
    let mut worker = m
        .session(SessionOptions {
            context: 8,
            max_batch: 2,
        })
        .unwrap();
    let mut a = worker.new_cache().unwrap();
    let mut logits = vec![0f32; 2 * vocab];
    // Out of vocabulary: nothing advances.
    let err = worker
        .decode_batch(
            &mut [BatchRow {
                kv: &mut a,
                token: vocab as u32,
            }],
            &mut logits[..vocab],
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::TokenOutOfVocab { .. }), "{err}");
    assert_eq!(a.position(), 0);
    // A logits buffer of the wrong size.
    let err = worker
        .decode_batch(
            &mut [BatchRow {
                kv: &mut a,
                token: 1,
            }],
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::LogitsBuffer { .. }), "{err}");
    // A cache of another shape.
    let other = m.session(SessionOptions::new(4)).unwrap();
    let mut foreign = other.new_cache().unwrap();
    let err = worker
        .decode_batch(
            &mut [BatchRow {
                kv: &mut foreign,
                token: 1,
            }],
            &mut logits[..vocab],
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
    // A full cache.
    worker.forward_in(&mut a, &[1; 8], Logits::None).unwrap();
    let err = worker
        .decode_batch(
            &mut [BatchRow {
                kv: &mut a,
                token: 1,
            }],
            &mut logits[..vocab],
        )
        .unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { .. }), "{err}");
}
