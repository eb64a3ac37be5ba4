//! Streaming detokenizer behaviour on real vocabularies: characters split
//! across byte tokens, stop strings spanning tokens, and SentencePiece's
//! leading space.

mod common;

use turbospark_text::{EncodeOptions, StreamDecoder, Tokenizer};

fn plain(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode_with(
        text,
        EncodeOptions {
            add_special: false,
            parse_special: false,
        },
    )
    .unwrap()
}

fn stream(dec: &mut StreamDecoder, ids: &[u32]) -> Vec<String> {
    let mut outs: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
    outs.push(dec.finish());
    outs
}

fn spm() -> Option<Tokenizer> {
    let dir = common::llama_cpp_models()?;
    Some(Tokenizer::from_gguf_file(dir.join("ggml-vocab-llama-spm.gguf")).unwrap())
}

fn bpe() -> Option<Tokenizer> {
    let dir = common::llama_cpp_models()?;
    Some(Tokenizer::from_gguf_file(dir.join("ggml-vocab-gpt-2.gguf")).unwrap())
}

#[test]
fn multibyte_character_split_across_byte_tokens() {
    let Some(tok) = spm() else { return };
    // The llama emoji is not in the SentencePiece vocabulary: four <0xNN> tokens.
    let ids = plain(&tok, "a🦙b");
    let llama: Vec<u32> = "🦙"
        .bytes()
        .map(|b| {
            (0..tok.vocab_size() as u32)
                .find(|&i| tok.token_text(i).as_deref() == Some(&format!("<0x{b:02X}>")))
                .unwrap()
        })
        .collect();
    assert!(ids.windows(4).any(|w| w == llama.as_slice()), "{ids:?}");
    let mut dec = StreamDecoder::new(&tok);
    let outs = stream(&mut dec, &ids);
    // Nothing is emitted while the character is incomplete.
    for o in &outs {
        assert!(!o.contains('\u{FFFD}'), "{outs:?}");
    }
    assert_eq!(outs.concat(), "a🦙b");
    let first_byte = ids.iter().position(|&i| i == llama[0]).unwrap();
    assert_eq!(outs[first_byte], "");
    assert_eq!(outs[first_byte + 1], "");
    assert_eq!(outs[first_byte + 2], "");
    assert_eq!(outs[first_byte + 3], "🦙");
}

#[test]
fn multibyte_character_split_in_byte_level_bpe() {
    let Some(tok) = bpe() else { return };
    let text = "日本語 and ü and 🦙";
    let ids = plain(&tok, text);
    let mut dec = StreamDecoder::new(&tok);
    let outs = stream(&mut dec, &ids);
    assert!(outs.iter().all(|o| !o.contains('\u{FFFD}')), "{outs:?}");
    assert_eq!(outs.concat(), text);
    // Some token held a partial character (GPT-2 has few CJK tokens).
    assert!(outs.iter().filter(|o| o.is_empty()).count() > 1, "{outs:?}");
}

#[test]
fn stop_string_spanning_tokens_is_never_emitted() {
    let Some(tok) = bpe() else { return };
    let text = "Hello there. STOP_HERE and more text";
    let ids = plain(&tok, text);
    let mut dec = StreamDecoder::new(&tok).with_stop_strings(["STOP_HERE"]);
    let mut emitted = String::new();
    let mut pushed = 0;
    for &id in &ids {
        let out = dec.push(id).unwrap();
        pushed += 1;
        emitted.push_str(&out);
        // No emitted text ends with a proper prefix of the stop string...
        // ...unless it is followed by text that rules the stop string out.
        assert!(
            !emitted.contains("STOP"),
            "partial stop string leaked: {emitted:?}"
        );
        if dec.is_stopped() {
            break;
        }
    }
    assert!(dec.is_stopped());
    assert_eq!(dec.stop_string(), Some("STOP_HERE"));
    assert_eq!(emitted, "Hello there. ");
    assert!(pushed < ids.len(), "stopped before the end");
    assert_eq!(dec.push(ids[0]).unwrap(), "");
    assert_eq!(dec.finish(), "");
}

#[test]
fn held_prefix_is_released_when_the_stop_string_does_not_follow() {
    let Some(tok) = bpe() else { return };
    let text = "a <|e not an end <|end|";
    let ids = plain(&tok, text);
    let mut dec = StreamDecoder::new(&tok).with_stop_strings(["<|end|>"]);
    let outs = stream(&mut dec, &ids);
    assert!(!dec.is_stopped());
    assert_eq!(outs.concat(), text);
    // The trailing "<|end|" was held until finish().
    assert!(outs.last().unwrap().ends_with("<|end|"), "{outs:?}");
}

#[test]
fn sentencepiece_leading_space_is_stripped_once() {
    let Some(tok) = spm() else { return };
    assert!(tok.strips_leading_space());
    let ids = plain(&tok, "Hello world");
    // Encoding added "▁" in front: the first token is "▁Hello".
    assert_eq!(tok.token_bytes(ids[0]), Some(&b" Hello"[..]));
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(stream(&mut dec, &ids).concat(), "Hello world");
    // Text that itself starts with a space keeps it.
    let ids = plain(&tok, " Hello");
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(stream(&mut dec, &ids).concat(), " Hello");
    // Continuing a generation: the rule can be turned off.
    let ids = plain(&tok, "Hello world");
    let mut dec = StreamDecoder::new(&tok).with_strip_leading_space(false);
    assert_eq!(stream(&mut dec, &ids).concat(), " Hello world");
}

#[test]
fn byte_level_bpe_keeps_leading_space() {
    let Some(tok) = bpe() else { return };
    assert!(!tok.strips_leading_space());
    let ids = plain(&tok, " Hello");
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(stream(&mut dec, &ids).concat(), " Hello");
}

#[test]
fn control_tokens_are_skipped_unless_asked() {
    let Some(tok) = spm() else { return };
    let ids = tok.encode("Hi", true).unwrap();
    assert_eq!(ids[0], tok.bos().unwrap());
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(stream(&mut dec, &ids).concat(), "Hi");
    // Rendered, BOS is the first piece, so the space SentencePiece put in
    // front of "Hi" stays (as HF decodes it).
    let mut dec = StreamDecoder::new(&tok).with_special_tokens(true);
    assert_eq!(stream(&mut dec, &ids).concat(), "<s> Hi");
}

#[test]
fn out_of_range_token_is_an_error() {
    let Some(tok) = bpe() else { return };
    let mut dec = StreamDecoder::new(&tok);
    assert!(dec.push(u32::MAX).is_err());
    assert!(tok.decode(&[u32::MAX]).is_err());
}
