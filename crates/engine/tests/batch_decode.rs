//! Batched decoding of several sequences ([`Session::decode_batch`], and
//! passes mixing prompt chunks with decode tokens, [`Session::forward_chunks`])
//! for every family's ArchSpec on random weights: each sequence, computed in
//! a batch whose members come and go, gets bit for bit the logits it gets
//! when it runs alone in a session of its own (prefill, then one token at a
//! time), in exact and in fast numerics; so does a sequence that continues
//! a prefix another sequence left in a cache ([`KvCache::rewind`]). The
//! reference is the single-sequence path, which `sessions.rs` checks
//! against one whole prefill.

mod common;

use common::{model_as, spec, FAMILIES};
use turbospark_core::QuantFormat;
use turbospark_cpu::Numerics;
use turbospark_engine::{
    BatchChunk, BatchRow, ControlVector, EngineError, KvCache, Logits, SessionOptions, SteerMode,
    Steering,
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

/// Logits of `prompt` alone (after the prompt, then after each of `fed`),
/// in a session of its own, the prompt in passes of `piece` tokens. A batch
/// must give a sequence the bits it gets alone in the same passes: gated
/// DeltaNet layers compute a pass of several tokens in chunks, so how a
/// prompt is cut changes their order of sums (`sessions.rs` bounds that
/// difference).
fn alone_logits<D: turbospark_backend::Device>(
    m: &turbospark_engine::Model<D>,
    steering: Option<&Steering>,
    prompt: &[u32],
    fed: &[u32],
    piece: usize,
) -> Vec<Vec<f32>> {
    let vocab = m.vocab_size();
    let mut s = m.session(SessionOptions::new(CONTEXT)).unwrap();
    s.set_steering(steering).unwrap();
    let mut last = vec![0f32; vocab];
    let mut start = 0;
    while start < prompt.len() {
        let end = (start + piece).min(prompt.len());
        let logits = if end == prompt.len() {
            Logits::Last(&mut last)
        } else {
            Logits::None
        };
        s.forward(start, &prompt[start..end], logits).unwrap();
        start = end;
    }
    let mut out = vec![last];
    for &t in fed {
        let pos = s.position();
        out.push(s.decode(t, pos).unwrap().to_vec());
    }
    out
}

/// The server's step: one pass over the decode tokens of the sequences
/// past their prompts and prompt chunks (of 4 tokens) of the others, which
/// join at different steps; every logits row equals the sequence's alone.
#[test]
fn mixed_prompt_chunks_and_decode_tokens_equal_each_sequence_alone() {
    check_mixed_chunks(None, None);
    check_mixed_chunks(Some(SteerMode::Add), None);
}

/// One sequence of the batch steered by control vectors of its own (the
/// server's per-request steering): it gets the logits it gets steered
/// alone, and the unsteered sequences beside it those they get alone.
#[test]
fn one_sequence_steered_in_a_batch_equals_it_steered_alone() {
    check_mixed_chunks(None, Some(SteerMode::Add));
    check_mixed_chunks(None, Some(SteerMode::Clamp));
}

/// `session`: steering of the whole session (every sequence); `own`:
/// steering of sequence 1 alone, through its chunks.
fn check_mixed_chunks(session: Option<SteerMode>, own: Option<SteerMode>) {
    const CHUNK: usize = 4;
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
            let own = own.map(|mode| steering(spec.hidden_size, mode));
            let steering = session.map(|mode| steering(spec.hidden_size, mode));
            let prompts: Vec<Vec<u32>> = PROMPTS
                .iter()
                .enumerate()
                .map(|(seq, &(len, _))| prompt(seq, len, vocab))
                .collect();
            let feds: Vec<Vec<u32>> = (0..PROMPTS.len())
                .map(|seq| (0..STEPS).map(|step| fed(seq, step, vocab)).collect())
                .collect();
            let alone: Vec<_> = (0..PROMPTS.len())
                .map(|seq| {
                    let steer = if seq == 1 && own.is_some() {
                        own.as_ref()
                    } else {
                        steering.as_ref()
                    };
                    alone_logits(&m, steer, &prompts[seq], &feds[seq], CHUNK)
                })
                .collect();

            if own.is_some() {
                let plain = alone_logits(&m, steering.as_ref(), &prompts[1], &feds[1], CHUNK);
                assert_ne!(plain, alone[1], "{family}: the steering changes nothing");
            }
            let mut worker = m.session(SessionOptions::new(CONTEXT)).unwrap();
            worker.set_steering(steering.as_ref()).unwrap();
            let prepared = own.as_ref().map(|s| worker.prepare_steering(s).unwrap());
            let chunk_steering = |seq: usize| prepared.as_ref().filter(|_| seq == 1);
            let mut caches: Vec<_> = PROMPTS
                .iter()
                .map(|_| worker.new_cache().unwrap())
                .collect();
            let mut prefilled = [0usize; 3];
            let mut steps_done = [0usize; 3];
            let mut logits = vec![0f32; PROMPTS.len() * vocab];
            for step in 0..STEPS + 6 {
                // (sequence, logits index in `alone[seq]`) of each logits row
                let mut expect = Vec::new();
                let mut chunks = Vec::new();
                for (seq, kv) in caches.iter_mut().enumerate() {
                    let len = PROMPTS[seq].0;
                    if PROMPTS[seq].1 > step {
                        continue;
                    }
                    if prefilled[seq] < len {
                        let end = (prefilled[seq] + CHUNK).min(len);
                        let last = end == len;
                        chunks.push(BatchChunk {
                            kv,
                            tokens: &prompts[seq][prefilled[seq]..end],
                            logits: last,
                            steering: chunk_steering(seq),
                        });
                        if last {
                            expect.push((seq, 0));
                        }
                        prefilled[seq] = end;
                    } else if steps_done[seq] < STEPS {
                        chunks.push(BatchChunk {
                            kv,
                            tokens: &feds[seq][steps_done[seq]..steps_done[seq] + 1],
                            logits: true,
                            steering: chunk_steering(seq),
                        });
                        steps_done[seq] += 1;
                        expect.push((seq, steps_done[seq]));
                    }
                }
                if chunks.is_empty() {
                    continue;
                }
                let out = &mut logits[..expect.len() * vocab];
                worker.forward_chunks(&mut chunks, out).unwrap();
                for (row, &(seq, at)) in expect.iter().enumerate() {
                    assert_eq!(
                        &out[row * vocab..(row + 1) * vocab],
                        &alone[seq][at][..],
                        "{family} {numerics:?}: sequence {seq}, logits {at} at step {step}"
                    );
                }
            }
            assert_eq!(steps_done, [STEPS; 3], "{family}");
            assert_eq!(worker.position(), 0, "{family}");
        }
    }
}

/// A cache rewound to a prefix its tokens share with a new prompt
/// continues as if the new prompt had been prefilled from scratch (the
/// server's prompt reuse), whether the prefix was computed as a prompt or
/// by decode steps.
#[test]
fn rewound_cache_continues_like_a_fresh_prefill() {
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
            let mut worker = m.session(SessionOptions::new(CONTEXT)).unwrap();
            // The first sequence: a prompt of 9, then 3 decoded tokens.
            let first = prompt(0, 9, vocab);
            let decoded: Vec<u32> = (0..3).map(|s| fed(0, s, vocab)).collect();
            let mut kv = worker.new_cache().unwrap();
            worker.forward_in(&mut kv, &first, Logits::None).unwrap();
            for &t in &decoded {
                let mut out = vec![0f32; vocab];
                let mut c = [BatchChunk {
                    kv: &mut kv,
                    tokens: &[t],
                    logits: true,
                    steering: None,
                }];
                worker.forward_chunks(&mut c, &mut out).unwrap();
            }
            assert_eq!(kv.position(), 12);
            if kv.has_recurrent_state() {
                // A recurrent state holds every position before the cache's:
                // it goes back only to the start.
                let err = kv.rewind(6).unwrap_err();
                assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
                assert_eq!(kv.position(), 12, "{family}");
                kv.rewind(12).unwrap();
                kv.rewind(0).unwrap();
                assert_eq!(kv.position(), 0, "{family}");
                continue;
            }
            let held: Vec<u32> = first.iter().chain(&decoded).copied().collect();
            // Shares 6 prompt tokens, or the prompt and 2 decoded tokens.
            for keep in [6usize, 11] {
                let mut next: Vec<u32> = held[..keep].to_vec();
                next.extend(prompt(1, 4, vocab));
                let feds: Vec<u32> = (0..3).map(|s| fed(1, s, vocab)).collect();
                let want = alone_logits(&m, None, &next, &feds, next.len());
                kv.rewind(12).unwrap();
                kv.rewind(keep).unwrap();
                assert_eq!(kv.position(), keep);
                let mut last = vec![0f32; vocab];
                worker
                    .forward_in(&mut kv, &next[keep..], Logits::Last(&mut last))
                    .unwrap();
                assert_eq!(last, want[0], "{family} {numerics:?}: prefix {keep}");
                for (i, &t) in feds.iter().enumerate() {
                    let mut out = vec![0f32; vocab];
                    let mut c = [BatchChunk {
                        kv: &mut kv,
                        tokens: &[t],
                        logits: true,
                        steering: None,
                    }];
                    worker.forward_chunks(&mut c, &mut out).unwrap();
                    assert_eq!(out, want[i + 1], "{family} {numerics:?}: prefix {keep}");
                }
                // Back to the first sequence's state for the next prefix.
                kv.rewind(0).unwrap();
                worker.forward_in(&mut kv, &held, Logits::None).unwrap();
            }
            // Never forward.
            let err = kv.rewind(13).unwrap_err();
            assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
        }
    }
}

/// A sliding layer's ring that has wrapped no longer holds the keys a
/// rewound sequence's queries read: rewinding is refused.
#[test]
fn rewind_is_refused_once_a_sliding_ring_wrapped() {
    let spec = spec("gemma4", &[]).expect("gemma4 fixture");
    let window = spec
        .layers
        .iter()
        .filter_map(|l| l.window)
        .min()
        .expect("a sliding layer");
    let m = model_as(&spec, 1, QuantFormat::F32, Numerics::Exact);
    let worker = m
        .session(SessionOptions {
            context: CONTEXT,
            max_batch: 2,
        })
        .unwrap();
    let mut kv: KvCache<_> = worker.new_cache().unwrap();
    let ring = window + 1;
    let mut w = worker;
    w.forward_in(&mut kv, &vec![1; ring], Logits::None).unwrap();
    kv.rewind(2).unwrap();
    w.forward_in(&mut kv, &vec![1; ring], Logits::None).unwrap();
    let err = kv.rewind(2).unwrap_err();
    assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
    assert_eq!(kv.position(), ring + 2);
    // Nor is its prefix copied to another cache, which stays as it was.
    let mut other: KvCache<_> = w.new_cache().unwrap();
    w.forward_in(&mut other, &[1, 2, 3], Logits::None).unwrap();
    let err = w.copy_prefix(&kv, &mut other, 2).unwrap_err();
    assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
    assert_eq!(other.position(), 3);
    // Rewinding to where it stands is no change.
    kv.rewind(ring + 2).unwrap();
}

/// A prefix copied from another sequence's cache (the server's reuse of a
/// prompt prefix another place computed, busy or free) continues exactly
/// as a fresh prefill of the whole prompt, whatever the copy overwrote.
#[test]
fn copied_prefix_continues_like_a_fresh_prefill() {
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
            let mut worker = m.session(SessionOptions::new(CONTEXT)).unwrap();
            // The source: a prompt of 9, then 3 decoded tokens.
            let first = prompt(0, 9, vocab);
            let decoded: Vec<u32> = (0..3).map(|s| fed(0, s, vocab)).collect();
            let mut src = worker.new_cache().unwrap();
            worker.forward_in(&mut src, &first, Logits::None).unwrap();
            for &t in &decoded {
                let mut out = vec![0f32; vocab];
                let mut c = [BatchChunk {
                    kv: &mut src,
                    tokens: &[t],
                    logits: true,
                    steering: None,
                }];
                worker.forward_chunks(&mut c, &mut out).unwrap();
            }
            // The destination held another sequence, longer than the copy.
            let mut dst = worker.new_cache().unwrap();
            worker
                .forward_in(&mut dst, &prompt(2, 14, vocab), Logits::None)
                .unwrap();
            if src.has_recurrent_state() {
                let err = worker.copy_prefix(&src, &mut dst, 6).unwrap_err();
                assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
                assert_eq!(dst.position(), 14, "{family}");
                worker.copy_prefix(&src, &mut dst, 0).unwrap();
                assert_eq!(dst.position(), 0, "{family}");
                continue;
            }
            let held: Vec<u32> = first.iter().chain(&decoded).copied().collect();
            // Shares 6 prompt tokens, or the prompt and 2 decoded tokens.
            for keep in [6usize, 11] {
                let mut next: Vec<u32> = held[..keep].to_vec();
                next.extend(prompt(1, 4, vocab));
                let feds: Vec<u32> = (0..3).map(|s| fed(1, s, vocab)).collect();
                let want = alone_logits(&m, None, &next, &feds, next.len());
                worker.copy_prefix(&src, &mut dst, keep).unwrap();
                assert_eq!(dst.position(), keep);
                let mut last = vec![0f32; vocab];
                worker
                    .forward_in(&mut dst, &next[keep..], Logits::Last(&mut last))
                    .unwrap();
                assert_eq!(last, want[0], "{family} {numerics:?}: prefix {keep}");
                for (i, &t) in feds.iter().enumerate() {
                    let mut out = vec![0f32; vocab];
                    let mut c = [BatchChunk {
                        kv: &mut dst,
                        tokens: &[t],
                        logits: true,
                        steering: None,
                    }];
                    worker.forward_chunks(&mut c, &mut out).unwrap();
                    assert_eq!(out, want[i + 1], "{family} {numerics:?}: prefix {keep}");
                }
            }
            // The source is untouched, and never copied past its position.
            assert_eq!(src.position(), 12);
            let err = worker.copy_prefix(&src, &mut dst, 13).unwrap_err();
            assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
        }
    }
}

#[test]
fn forward_chunks_checks_its_inputs() {
    let spec = spec("llama", &[]).expect("llama fixture");
    let m = model_as(&spec, 1, QuantFormat::F32, Numerics::Exact);
    let vocab = spec.vocab_size;
    let mut worker = m
        .session(SessionOptions {
            context: 8,
            max_batch: 4,
        })
        .unwrap();
    let (mut a, mut b) = (worker.new_cache().unwrap(), worker.new_cache().unwrap());
    let mut logits = vec![0f32; 2 * vocab];
    let mut run = |w: &mut turbospark_engine::Session<'_, _>,
                   a: &mut KvCache<_>,
                   b: &mut KvCache<_>,
                   ta: &[u32],
                   tb: &[u32],
                   rows: usize| {
        let mut c = [
            BatchChunk {
                kv: a,
                tokens: ta,
                logits: true,
                steering: None,
            },
            BatchChunk {
                kv: b,
                tokens: tb,
                logits: true,
                steering: None,
            },
        ];
        w.forward_chunks(&mut c, &mut logits[..rows * vocab])
    };
    let bad = vocab as u32;
    let err = run(&mut worker, &mut a, &mut b, &[1, 2], &[3, bad], 2).unwrap_err();
    assert!(
        matches!(err, EngineError::TokenOutOfVocab { index: 3, .. }),
        "{err}"
    );
    let err = run(&mut worker, &mut a, &mut b, &[1, 2], &[], 2).unwrap_err();
    assert!(matches!(err, EngineError::EmptyInput), "{err}");
    let err = run(&mut worker, &mut a, &mut b, &[1, 2, 3], &[4, 5], 2).unwrap_err();
    assert!(matches!(err, EngineError::BadOptions { .. }), "{err}");
    let err = run(&mut worker, &mut a, &mut b, &[1], &[2], 1).unwrap_err();
    assert!(matches!(err, EngineError::LogitsBuffer { .. }), "{err}");
    // Nothing advanced on any error; a good pass advances both.
    assert_eq!((a.position(), b.position()), (0, 0));
    run(&mut worker, &mut a, &mut b, &[1, 2], &[3], 2).unwrap();
    assert_eq!((a.position(), b.position()), (2, 1));
    let err = run(&mut worker, &mut a, &mut b, &[1; 4], &[], 2).unwrap_err();
    assert!(matches!(err, EngineError::EmptyInput), "{err}");
}
