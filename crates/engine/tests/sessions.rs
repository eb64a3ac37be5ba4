//! Session behaviour for every family's ArchSpec on random weights:
//!
//! - decoding tokens one at a time gives the same logits as one prefill,
//!   and as a prefill split into small batches that makes every sliding
//!   layer's KV ring wrap many times (each row of every op is computed the
//!   same way whatever the batch, so the match is exact);
//! - sessions on one model run at the same time on their own streams and
//!   give the logits one session alone gives, with or without route
//!   statistics (which only decide whether routes are read back);
//! - bad input is a typed error and leaves the session usable;
//! - the phase timers see exactly the phases a family runs.

mod common;

use common::{model, spec, tokens, FAMILIES};
use turbospark_engine::{EngineError, Logits, SessionOptions};

const N: usize = 40;

#[test]
fn concurrent_sessions_share_the_model_and_match_one_alone() {
    for &family in FAMILIES {
        let Some(spec) = spec(family, &[]) else {
            println!("skipped {family}: fixture absent");
            continue;
        };
        let m = model(&spec, 2);
        let vocab = spec.vocab_size;
        let toks = tokens(12, vocab);
        let run = |statistics: bool| {
            let mut s = m.session(SessionOptions::new(toks.len())).unwrap();
            s.set_route_statistics(statistics);
            let mut out = vec![0f32; toks.len() * vocab];
            s.prefill(&toks, &mut out).unwrap();
            let observed = s.router_histogram().clone();
            (out, observed)
        };
        let (alone, _) = run(true);
        let (a, b) = std::thread::scope(|scope| {
            let a = scope.spawn(|| run(true));
            let b = scope.spawn(|| run(false));
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(a.0, alone, "{family}: a concurrent session differs");
        assert_eq!(
            b.0, alone,
            "{family}: a session without route statistics differs"
        );
        if spec.moe.is_some() {
            assert_ne!(
                a.1, b.1,
                "{family}: only the counting session counts routes"
            );
        }
    }
}

#[test]
fn decode_equals_prefill_including_wrapped_sliding_windows() {
    for &family in FAMILIES {
        let Some(spec) = spec(family, &[]) else {
            println!("skipped {family}: fixture absent");
            continue;
        };
        let m = model(&spec, 2);
        let vocab = spec.vocab_size;
        let toks = tokens(N, vocab);

        let mut whole = m
            .session(SessionOptions {
                context: N,
                max_batch: N,
            })
            .unwrap();
        let mut reference = vec![0f32; N * vocab];
        whole.prefill(&toks, &mut reference).unwrap();
        assert_eq!(whole.position(), N);
        assert!(reference.iter().all(|v| v.is_finite()), "{family}");

        // Batches of 3 with a longer context: sliding layers hold w + 2 rows.
        let mut chunked = m
            .session(SessionOptions {
                context: 2 * N,
                max_batch: 3,
            })
            .unwrap();
        let wrapped = spec
            .layers
            .iter()
            .enumerate()
            .any(|(l, ls)| ls.window.is_some() && chunked.kv().capacity(l).unwrap() < N);
        assert_eq!(
            wrapped,
            spec.layers.iter().any(|l| l.window.is_some()),
            "{family}"
        );
        let mut got = vec![0f32; N * vocab];
        chunked.prefill(&toks, &mut got).unwrap();
        assert_eq!(got, reference, "{family}: chunked prefill differs");

        let mut dec = m
            .session(SessionOptions {
                context: N,
                max_batch: 3,
            })
            .unwrap();
        for (pos, &t) in toks.iter().enumerate() {
            let row = dec.decode(t, pos).unwrap();
            assert_eq!(
                row,
                &reference[pos * vocab..(pos + 1) * vocab],
                "{family}: decode differs from prefill at position {pos}"
            );
        }

        // Last-row logits of a prefill are the last row of the full prefill.
        let mut last = m.session(SessionOptions::new(N)).unwrap();
        let mut out = vec![0f32; vocab];
        last.forward(0, &toks, Logits::Last(&mut out)).unwrap();
        assert_eq!(
            out,
            reference[(N - 1) * vocab..],
            "{family}: last-row logits"
        );
        println!("{family}: decode = chunked prefill = prefill over {N} tokens");
    }
}

#[test]
fn bad_input_is_a_typed_error_and_leaves_the_session_usable() {
    let spec = spec("gpt_oss", &[]).or_else(|| spec("llama", &[])).unwrap();
    let m = model(&spec, 1);
    let vocab = spec.vocab_size;
    let mut s = m.session(SessionOptions::new(4)).unwrap();

    let err = s.decode(vocab as u32, 0).unwrap_err();
    assert!(
        matches!(err, EngineError::TokenOutOfVocab { token, index: 0, vocab: v } if token as usize == vocab && v == vocab),
        "{err}"
    );
    let mut out = vec![0f32; 3 * vocab];
    let err = s.prefill(&[1, 2, u32::MAX], &mut out).unwrap_err();
    assert!(
        matches!(err, EngineError::TokenOutOfVocab { index: 2, .. }),
        "{err}"
    );
    assert_eq!(
        s.position(),
        0,
        "a rejected call must not advance the cache"
    );

    let first = s.decode(5, 0).unwrap().to_vec();
    let err = s.decode(6, 2).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NonSequentialPosition {
                expected: 1,
                got: 2
            }
        ),
        "{err}"
    );
    let err = s.decode(6, 0).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::NonSequentialPosition {
                expected: 1,
                got: 0
            }
        ),
        "{err}"
    );

    let mut out = vec![0f32; 4 * vocab];
    let err = s
        .forward(1, &[1, 2, 3, 4], Logits::All(&mut out))
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ContextOverflow {
                position: 1,
                tokens: 4,
                context: 4
            }
        ),
        "{err}"
    );
    let err = s.forward(1, &[], Logits::None).unwrap_err();
    assert!(matches!(err, EngineError::EmptyInput), "{err}");
    let mut short = vec![0f32; vocab - 1];
    let err = s.forward(1, &[1], Logits::Last(&mut short)).unwrap_err();
    assert!(matches!(err, EngineError::LogitsBuffer { .. }), "{err}");
    assert_eq!(s.position(), 1);

    // The session carries on as if nothing had been rejected.
    for pos in 1..4 {
        s.decode(7, pos).unwrap();
    }
    let err = s.decode(7, 4).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ContextOverflow {
                position: 4,
                tokens: 1,
                context: 4
            }
        ),
        "{err}"
    );
    let mut fresh = m.session(SessionOptions::new(4)).unwrap();
    assert_eq!(fresh.decode(5, 0).unwrap(), first.as_slice());

    // Messages name the offending value.
    let msg = EngineError::TokenOutOfVocab {
        token: 300,
        index: 1,
        vocab: 256,
    }
    .to_string();
    assert!(msg.contains("300") && msg.contains("256"), "{msg}");

    let err = m
        .session(SessionOptions {
            context: 0,
            max_batch: 1,
        })
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
}

#[test]
fn phase_times_cover_the_phases_each_family_runs() {
    use turbospark_engine::timing::Phase;
    for &family in FAMILIES {
        let Some(spec) = spec(family, &[]) else {
            continue;
        };
        let m = model(&spec, 1);
        let mut s = m.session(SessionOptions::new(16)).unwrap();
        let mut last = vec![0f32; spec.vocab_size];
        let started = std::time::Instant::now();
        s.forward(0, &tokens(8, spec.vocab_size), Logits::Last(&mut last))
            .unwrap();
        let wall = started.elapsed();
        let t = *s.phase_times();
        let moe = spec.moe.is_some();
        let dense = spec.moe_layers().count() < spec.layers.len()
            || spec
                .moe
                .as_ref()
                .is_some_and(|m| m.parallel_dense || m.shared_intermediate.is_some());
        for (phase, runs) in [
            (Phase::Embed, true),
            (Phase::Attention, true),
            (Phase::DenseFfn, dense),
            (Phase::Router, moe),
            (Phase::Experts, moe),
            (Phase::Head, true),
        ] {
            assert_eq!(!t.get(phase).is_zero(), runs, "{family}: {phase:?} in {t}");
        }
        // The phases are disjoint laps within the call.
        assert!(t.total() <= wall, "{family}: {t} over {wall:?}");
        s.phase_times_mut().reset();
        assert!(s.phase_times().total().is_zero());
    }
}

/// Latent attention caches one row `[k_rope, c]` per position and layer,
/// read as keys and values: the compressed size, not the expanded K and V
/// of every head.
#[test]
fn latent_attention_caches_the_compressed_rows() {
    let Some(spec) = spec("deepseek_v3", &[]) else {
        println!("skipped deepseek_v3: fixture absent");
        return;
    };
    let mla = spec.mla.expect("deepseek_v3 has latent attention");
    let m = model(&spec, 1);
    let s = m.session(SessionOptions::new(64)).unwrap();
    let compressed = spec.num_layers() * (mla.kv_lora_rank + mla.qk_rope_head_dim);
    let expanded = spec.num_layers()
        * spec.num_heads
        * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim);
    assert_eq!(s.kv().elements_per_position(), compressed);
    println!(
        "deepseek_v3 KV per position: {compressed} elements ({} bytes f32) vs {expanded} expanded ({} bytes)",
        compressed * 4,
        expanded * 4
    );
}
