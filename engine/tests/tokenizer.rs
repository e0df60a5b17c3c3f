//! Tokenizer tests over the five fixture model folders: encoding matches the
//! transformers reference ids, decoding matches its text, the incremental
//! detokenizer reproduces `decode` on real and random token streams, and
//! special tokens / EOS ids are read from the config files.

use std::path::{Path, PathBuf};

use engine::text::tokenizer::{SpecialTokens, StopMatcher, StopOutcome, StopStrings, Tokenizer};
use rand::{Rng, SeedableRng};
use serde_json::Value;

const FIXTURES: [&str; 5] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "qwen3-moe-tiny", "mistral-tiny"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn reference_json(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// An int64 tensor of `reference.safetensors` as token ids.
fn reference_ids(dir: &Path, name: &str) -> Vec<u32> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(view.dtype(), safetensors::Dtype::I64, "{name}");
    view.data().chunks_exact(8).map(|c| u32::try_from(i64::from_le_bytes(c.try_into().unwrap())).unwrap()).collect()
}

/// Streams `ids` through a fresh [`DecodeStream`](engine::text::tokenizer::stream::DecodeStream),
/// returning the pieces (the final flush last).
fn stream_pieces(tok: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Vec<String> {
    let mut stream = tok.decode_stream(skip_special_tokens);
    let mut pieces: Vec<String> = ids.iter().map(|&id| stream.step(tok, id).unwrap()).collect();
    pieces.push(stream.finish(tok).unwrap());
    pieces
}

#[test]
fn encode_matches_reference_ids() {
    for name in FIXTURES {
        let dir = fixture(name);
        let tok = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let reference = reference_json(&dir);
        for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
            let text = case["text"].as_str().unwrap();
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(ids, reference_ids(&dir, &format!("case{i}.input_ids")), "{name} case {i}");
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "{name} case {i} round trip");
        }
        let chat = &reference["chat"];
        let expected: Vec<u32> =
            chat["ids"].as_array().unwrap().iter().map(|v| u32::try_from(v.as_u64().unwrap()).unwrap()).collect();
        let rendered = chat["rendered"].as_str().unwrap();
        assert_eq!(tok.encode(rendered, false).unwrap(), expected, "{name} chat");
        assert_eq!(tok.decode(&expected, false).unwrap(), rendered, "{name} chat round trip");
    }
}

#[test]
fn decode_and_stream_match_reference_greedy_text() {
    for name in FIXTURES {
        let dir = fixture(name);
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let reference = reference_json(&dir);
        for (i, case) in reference["cases"].as_array().unwrap().iter().enumerate() {
            let ids = reference_ids(&dir, &format!("case{i}.greedy_ids"));
            let expected = case["greedy_text"].as_str().unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), expected, "{name} case {i}");
            assert_eq!(stream_pieces(&tok, &ids, false).concat(), expected, "{name} case {i} streamed");
        }
    }
}

#[test]
fn special_tokens_and_eos_ids_come_from_the_configs() {
    let llama = Tokenizer::from_dir(&fixture("llama-tiny")).unwrap();
    assert_eq!(llama.bos_token(), Some("<|begin_of_text|>"));
    assert_eq!(llama.bos_token_id(), Some(0));
    assert_eq!(llama.eos_token(), Some("<|eot_id|>"));
    assert_eq!(llama.eos_token_ids(), [4]);
    assert!(llama.is_eos(4) && !llama.is_eos(1));
    assert_eq!(llama.vocab_size(), 512);
    assert_eq!(llama.token_to_id("<|eot_id|>"), Some(4));
    assert_eq!(llama.id_to_token(4).as_deref(), Some("<|eot_id|>"));

    let qwen = Tokenizer::from_dir(&fixture("qwen3-tiny")).unwrap();
    assert_eq!(qwen.bos_token(), None);
    assert_eq!(qwen.bos_token_id(), None);
    assert_eq!(qwen.eos_token_ids(), [2]);
    assert_eq!(qwen.special_tokens().pad_token.as_deref(), Some("<|endoftext|>"));
}

#[test]
fn config_overrides_and_bad_folders() {
    let src = fixture("llama-tiny");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    let config =
        r#"{"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, "add_bos_token": true}"#;
    std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
    std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": [4, 1, 3]}"#).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token_ids(), [1, 4, 3]);
    let with_bos = tok.encode("hi", true).unwrap();
    assert_eq!(with_bos[0], 0);
    assert_eq!(&with_bos[1..], tok.encode("hi", false).unwrap());

    std::fs::write(dir.path().join("generation_config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("generation_config.json"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let err = Tokenizer::from_dir(&dir.path().join("missing")).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn in_memory_tokenizer_with_special_tokens() {
    let inner = tokenizers::Tokenizer::from_file(fixture("qwen2-tiny").join("tokenizer.json")).unwrap();
    let special = SpecialTokens { eos_token: Some("<|im_end|>".into()), ..SpecialTokens::default() };
    let tok = Tokenizer::new(inner, special, vec![0, 2]);
    assert_eq!(tok.eos_token_ids(), [2, 0]);
    assert_eq!(tok.encode("<|im_start|>user", false).unwrap()[0], 1);
}

/// The core property of the incremental detokenizer, on random token
/// sequences over each vocabulary (special tokens and lone bytes included,
/// so many sequences are invalid UTF-8 in the middle): the pieces concatenate
/// to `decode(all)`, and no piece emitted before the end finishes with an
/// incomplete character that a later token completes.
#[test]
fn stream_concatenation_equals_decode_on_random_ids() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for name in FIXTURES {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        let vocab = u32::try_from(tok.vocab_size()).unwrap();
        // Tokens of one non-ASCII byte: lead and continuation bytes, mixed at
        // random, make incomplete, invalid and completed characters.
        let high_bytes: Vec<u32> = (0..vocab)
            .filter(|&id| {
                let token = tok.id_to_token(id).unwrap_or_default();
                token.chars().count() == 1 && !tok.decode(&[id], false).unwrap().is_ascii()
            })
            .collect();
        assert!(high_bytes.len() >= 100, "{name}: byte-level vocabulary expected");
        for trial in 0..400 {
            let len = rng.gen_range(0..48);
            let byte_heavy = trial % 4 >= 2;
            let ids: Vec<u32> = (0..len)
                .map(|_| {
                    if byte_heavy && rng.gen_bool(0.8) {
                        high_bytes[rng.gen_range(0..high_bytes.len())]
                    } else {
                        rng.gen_range(0..vocab)
                    }
                })
                .collect();
            let skip = trial % 2 == 1;
            let pieces = stream_pieces(&tok, &ids, skip);
            let expected = tok.decode(&ids, skip).unwrap();
            assert_eq!(pieces.concat(), expected, "{name}: ids {ids:?} skip={skip}");
            // Each prefix of the stream is a prefix of the final text: nothing
            // emitted is ever contradicted later.
            let mut emitted = String::new();
            for piece in &pieces {
                emitted.push_str(piece);
                assert!(expected.starts_with(&emitted), "{name}: ids {ids:?}");
            }
        }
    }
}

/// Real text with multi-byte characters split across byte-level tokens:
/// every piece is complete text (no U+FFFD) and the stream equals the input.
#[test]
fn stream_never_splits_a_character() {
    let text = "Traduis « bonjour » en 日本語, s'il te plaît. 🙂🎉 Ünïcödé — ok\nnext line";
    for name in FIXTURES {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.len() > text.chars().count() / 2, "{name}: expected byte-level splits");
        let pieces = stream_pieces(&tok, &ids, true);
        for piece in &pieces {
            assert!(!piece.contains('\u{FFFD}'), "{name}: piece {piece:?}");
        }
        assert_eq!(pieces.concat(), text, "{name}");
        assert!(pieces.iter().filter(|p| p.is_empty()).count() > 0, "{name}: some token should be held back");
    }
}

/// A long run of invalid bytes does not make the stream hold everything
/// back to the end (the held window stays bounded).
#[test]
fn stream_releases_invalid_bytes() {
    let tok = Tokenizer::from_dir(&fixture("qwen3-tiny")).unwrap();
    // Byte-level tokens for the lone continuation byte 0x80 ("Ā" in the
    // GPT-2 byte map) and a lone lead byte 0xE6 ("æ" maps to 0xE6).
    let cont = tok.token_to_id("Ā").unwrap();
    let ids = vec![cont; 40];
    let mut stream = tok.decode_stream(false);
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&stream.step(&tok, id).unwrap());
    }
    assert!(out.chars().count() >= 30, "released {} of 40", out.chars().count());
    out.push_str(&stream.finish(&tok).unwrap());
    assert_eq!(out, tok.decode(&ids, false).unwrap());
}

/// Detokenizer and stop strings together, as a server streams them.
#[test]
fn stop_strings_over_streamed_tokens() {
    let tok = Tokenizer::from_dir(&fixture("llama-tiny")).unwrap();
    let text = "The answer is 42.\n\nUser: next question";
    let ids = tok.encode(text, false).unwrap();
    let mut stream = tok.decode_stream(true);
    let mut stop = StopMatcher::new(StopStrings::new(["\n\nUser:", "never"]).unwrap());
    let mut sent = String::new();
    let mut stopped = None;
    for &id in &ids {
        let piece = stream.step(&tok, id).unwrap();
        match stop.push(&piece) {
            StopOutcome::Continue(t) => sent.push_str(&t),
            StopOutcome::Stopped(hit) => {
                sent.push_str(&hit.text);
                stopped = Some(hit.stop_idx);
                break;
            }
        }
    }
    assert_eq!(stopped, Some(0));
    assert_eq!(sent, "The answer is 42.");
}

/// Issue 14, row 10: a model that emits skipped special tokens without end
/// does not grow the detokenizer's window (each step decodes the window, so
/// a growing one costs quadratic time); the text is still `decode(all)`.
#[test]
fn skipped_special_tokens_keep_the_window_bounded() {
    for name in FIXTURES {
        let tok = Tokenizer::from_dir(&fixture(name)).unwrap();
        let words = tok.encode("hello world, again", false).unwrap();
        let special = *tok.eos_token_ids().first().expect("an EOS id");
        let mut ids = words.clone();
        ids.extend(std::iter::repeat_n(special, 5000));
        ids.extend(&words);
        let mut stream = tok.decode_stream(true);
        let mut text = String::new();
        let mut widest = 0;
        for &id in &ids {
            text.push_str(&stream.step(&tok, id).unwrap());
            widest = widest.max(stream.window_len());
        }
        text.push_str(&stream.finish(&tok).unwrap());
        assert_eq!(text, tok.decode(&ids, true).unwrap(), "{name}");
        assert!(widest <= 16, "{name}: the window grew to {widest} tokens");
    }
}
