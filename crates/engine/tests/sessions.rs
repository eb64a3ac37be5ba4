//! Session behaviour for every family's ArchSpec on random weights:
//!
//! - decoding tokens one at a time gives the same logits as one prefill,
//!   and as a prefill split into small batches that makes every sliding
//!   layer's KV ring wrap many times (each row of every op is computed the
//!   same way whatever the batch, so the match is exact; gated DeltaNet
//!   layers run a pass of several tokens in chunks, so a family with them
//!   matches within `RECURRENT_PASS_TOLERANCE`);
//! - sessions on one model run at the same time on their own streams and
//!   give the logits one session alone gives, with or without route
//!   statistics (which only decide whether routes are read back);
//! - bad input is a typed error and leaves the session usable;
//! - the phase timers see exactly the phases a family runs;
//! - a recurrent (DeltaNet) state is constant in the context and never
//!   outlives its sequence.

mod common;

use common::{max_rel_diff, model, spec, tokens, FAMILIES, RECURRENT_PASS_TOLERANCE};
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
        // Exact, or within the tolerance of a recurrence cut into other
        // passes; returns how far apart.
        let recurrent = spec.delta_net.is_some();
        let mut worst = 0f64;
        let mut same = |got: &[f32], want: &[f32], what: &str| {
            if recurrent {
                let d = max_rel_diff(got, want);
                assert!(
                    d <= RECURRENT_PASS_TOLERANCE,
                    "{family}: {what} differs by {d:e} of the logits' scale"
                );
                worst = worst.max(d);
            } else {
                assert_eq!(got, want, "{family}: {what} differs");
            }
        };
        let mut got = vec![0f32; N * vocab];
        chunked.prefill(&toks, &mut got).unwrap();
        same(&got, &reference, "chunked prefill");

        let mut dec = m
            .session(SessionOptions {
                context: N,
                max_batch: 3,
            })
            .unwrap();
        for (pos, &t) in toks.iter().enumerate() {
            let row = dec.decode(t, pos).unwrap();
            same(
                row,
                &reference[pos * vocab..(pos + 1) * vocab],
                &format!("decode at position {pos}"),
            );
        }

        // Last-row logits of a prefill are the last row of the full prefill.
        let mut last = m.session(SessionOptions::new(N)).unwrap();
        let mut out = vec![0f32; vocab];
        last.forward(0, &toks, Logits::Last(&mut out)).unwrap();
        same(&out, &reference[(N - 1) * vocab..], "last-row logits");
        if recurrent {
            println!(
                "{family}: decode ≈ chunked prefill ≈ prefill over {N} tokens \
                 (at most {worst:.2e} of the logits' scale apart)"
            );
        } else {
            println!("{family}: decode = chunked prefill = prefill over {N} tokens");
        }
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

/// Gated DeltaNet keeps a state per sequence whose size does not depend on
/// the context: the same at 1k and 8k positions; only the full-attention
/// layers keep rows per position.
#[test]
fn recurrent_state_is_constant_in_the_context() {
    let Some(spec) = spec("qwen3_5_moe", &[]) else {
        println!("skipped qwen3_5_moe: fixture absent");
        return;
    };
    let d = spec.delta_net.expect("qwen3_5_moe has DeltaNet layers");
    let delta_layers = spec
        .layers
        .iter()
        .filter(|l| l.mixer == turbospark_core::arch::Mixer::DeltaNet)
        .count();
    let m = model(&spec, 1);
    let mut sizes = Vec::new();
    for context in [1024, 8192] {
        let s = m.session(SessionOptions::new(context)).unwrap();
        let kv = s.kv();
        // By hand: (k − 1)·(2·hk·dk + hv·dv) + hv·dk·dv per DeltaNet layer.
        let per_layer = (d.conv_kernel - 1)
            * (2 * d.k_heads * d.k_head_dim + d.v_heads * d.v_head_dim)
            + d.v_heads * d.k_head_dim * d.v_head_dim;
        assert_eq!(kv.state_elements(), delta_layers * per_layer);
        // The one full-attention layer: k and v rows of 2 heads of 16.
        assert_eq!(kv.elements_per_position(), 2 * 2 * 16);
        sizes.push((context, kv.state_elements()));
    }
    assert_eq!(sizes[0].1, sizes[1].1);
    for (context, n) in sizes {
        println!(
            "qwen3_5_moe (tiny) at {context} positions: recurrent state {n} elements ({} bytes f32)",
            n * 4
        );
    }
}

/// A sequence with a recurrent state cannot rewind: a pass must start at
/// the cache's position, and after a reset the state restarts from zeros,
/// so the logits of a new conversation are those of a fresh session (the
/// stale state of the old one is never read).
#[test]
fn recurrent_state_never_outlives_its_sequence() {
    let Some(spec) = spec("qwen3_5_moe", &[]) else {
        println!("skipped qwen3_5_moe: fixture absent");
        return;
    };
    let m = model(&spec, 1);
    let vocab = spec.vocab_size;
    let first = tokens(12, vocab);
    // Shares a prefix of 5 tokens with `first`, then diverges (a rewind).
    let mut second = first[..5].to_vec();
    second.extend(tokens(9, vocab).iter().map(|t| (t + 7) % vocab as u32));

    let mut fresh = m.session(SessionOptions::new(32)).unwrap();
    let mut want = vec![0f32; second.len() * vocab];
    fresh.prefill(&second, &mut want).unwrap();

    let mut s = m.session(SessionOptions::new(32)).unwrap();
    let mut out = vec![0f32; first.len() * vocab];
    s.prefill(&first, &mut out).unwrap();
    s.decode(3, first.len()).unwrap();
    // Rewinding to the shared prefix is refused: the state holds 13 tokens.
    let mut last = vec![0f32; vocab];
    let e = s
        .forward(5, &second[5..], Logits::Last(&mut last))
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::NonSequentialPosition {
                expected: 13,
                got: 5
            }
        ),
        "{e}"
    );
    s.reset();
    let mut got = vec![0f32; second.len() * vocab];
    s.prefill(&second, &mut got).unwrap();
    assert_eq!(
        got, want,
        "after a reset the old state leaked into the logits"
    );
    // And token by token after another reset, as a fresh session decodes
    // (prefill runs the recurrence in chunks, decode token by token).
    let mut alone = m.session(SessionOptions::new(32)).unwrap();
    s.reset();
    for (i, &t) in second.iter().enumerate() {
        let want = alone.decode(t, i).unwrap().to_vec();
        let row = s.decode(t, i).unwrap();
        assert_eq!(row, &want[..], "decode at {i}");
    }
}
