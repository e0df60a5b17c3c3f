//! Stop strings and incremental detokenization against references.
//!
//! The input gives stop strings, a text and where it is cut into pieces;
//! [`StopMatcher`] over the pieces must release exactly what it releases
//! when fed one character at a time (and never a stop string). Then the
//! same bytes as token ids: [`DecodeStream`]'s pieces must concatenate to
//! `decode(all)`.
#![no_main]

use std::sync::OnceLock;

use engine::text::tokenizer::{StopMatcher, StopOutcome, StopStrings, Tokenizer};
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny");
        Tokenizer::from_dir(&dir).expect("the fixture tokenizer")
    })
}

/// Everything released, and the index of the stop string that ended it.
fn run(stops: &StopStrings, pieces: &[&str]) -> (String, Option<usize>) {
    let mut m = StopMatcher::new(stops.clone());
    let mut out = String::new();
    for piece in pieces {
        match m.push(piece) {
            StopOutcome::Continue(t) => out.push_str(&t),
            StopOutcome::Stopped(hit) => {
                out.push_str(&hit.text);
                return (out, Some(hit.stop_idx));
            }
        }
    }
    out.push_str(&m.finish());
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    // `stop1 \x01 stop2 \x01 ... \x02 text \x02 cuts`, lossily as UTF-8.
    let mut parts = data.splitn(3, |&b| b == 2);
    let stops_part = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let cuts = parts.next().unwrap_or_default();
    let stop_list: Vec<&str> = stops_part.split('\u{1}').filter(|s| !s.is_empty()).take(64).collect();
    let Ok(stops) = StopStrings::new(&stop_list) else { return };

    let chars: Vec<String> = text.chars().map(String::from).collect();
    let char_refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    let reference = run(&stops, &char_refs);
    let mut pieces = Vec::new();
    let mut rest = text.as_str();
    for &c in cuts {
        if rest.is_empty() {
            break;
        }
        let n = usize::from(c % 8) + 1;
        let cut = rest.char_indices().nth(n).map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces.push(rest);
    let got = run(&stops, &pieces);
    assert_eq!(got, reference, "stops {stop_list:?}, pieces {pieces:?}");
    match reference {
        (out, Some(idx)) => {
            assert!(text.starts_with(&out) && text[out.len()..].starts_with(stop_list[idx]));
            assert!(!stop_list.iter().any(|s| out.contains(s)), "a stop string was released");
        }
        (out, None) => assert_eq!(out, text),
    }

    let tok = tokenizer();
    let vocab = tok.vocab_size() as u32;
    let ids: Vec<u32> = data.chunks(2).map(|c| c.iter().fold(0u32, |a, &b| a * 256 + u32::from(b)) % vocab).collect();
    for skip in [false, true] {
        let mut stream = tok.decode_stream(skip);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.step(tok, id).expect("decoding ids of the vocabulary"));
        }
        out.push_str(&stream.finish(tok).expect("decoding ids of the vocabulary"));
        assert_eq!(out, tok.decode(&ids, skip).expect("decoding ids of the vocabulary"), "ids {ids:?}");
    }
});
