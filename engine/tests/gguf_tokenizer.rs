//! The tokenizer rebuilt from GGUF metadata: a synthetic vocabulary written
//! with `models::gguf::GgufWriter`, and the real SmolLM2-135M GGUF against
//! llama.cpp's ids in `tests/fixtures/smollm2-135m-q41/reference.json` (when
//! `MINISGL_SMOLLM2_GGUF` points at the file; skipped with a notice otherwise).

use std::path::PathBuf;

use engine::text::gguf_tokenizer::{tokenizer_from_gguf, GgufTokenizer, GgufTokenizerError};
use models::gguf::{GgufFile, GgufWriter, MetadataArray, MetadataValue};

/// GPT-2's byte-to-unicode table: the byte-level alphabet, in byte order.
fn byte_chars() -> Vec<char> {
    (0u32..256)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            if printable {
                char::from_u32(b).unwrap()
            } else {
                // Non-printable bytes map to 256.. in order of appearance.
                let n = (0..b)
                    .filter(|&x| !((33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x)))
                    .count();
                char::from_u32(256 + n as u32).unwrap()
            }
        })
        .collect()
}

const CONTROL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const MERGES: [&str; 7] = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "1 2"];

/// A byte-level vocabulary: 3 control tokens, 256 byte tokens, the merge
/// results, and a user-defined `<think>`.
fn synthetic(pre: &str, edit: impl FnOnce(&mut GgufWriter)) -> GgufFile {
    let mut tokens: Vec<String> = CONTROL.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3i32; 3];
    for c in byte_chars() {
        tokens.push(c.to_string());
        types.push(1);
    }
    for m in MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    tokens.push("<think>".into());
    types.push(4);
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", MetadataValue::String("llama".into()))
        .metadata("tokenizer.ggml.model", MetadataValue::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", MetadataValue::String(pre.into()))
        .metadata("tokenizer.ggml.tokens", MetadataValue::Array(MetadataArray::String(tokens)))
        .metadata("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(types)))
        .metadata(
            "tokenizer.ggml.merges",
            MetadataValue::Array(MetadataArray::String(MERGES.iter().map(|s| s.to_string()).collect())),
        )
        .metadata("tokenizer.ggml.bos_token_id", MetadataValue::U32(1))
        .metadata("tokenizer.ggml.eos_token_id", MetadataValue::U32(2))
        .metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false))
        .metadata("tokenizer.chat_template", MetadataValue::String("{{ messages }}".into()));
    edit(&mut w);
    GgufFile::from_bytes("synthetic.gguf", w.to_bytes()).unwrap()
}

fn id(t: &GgufTokenizer, token: &str) -> u32 {
    t.tokenizer.token_to_id(token).unwrap_or_else(|| panic!("no token {token:?}"))
}

fn encode(t: &GgufTokenizer, text: &str, parse_special: bool) -> Vec<u32> {
    let mut tok = t.tokenizer.clone();
    tok.set_encode_special_tokens(!parse_special);
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

#[test]
fn byte_level_bpe_with_merges_and_specials() {
    let t = tokenizer_from_gguf(&synthetic("smollm", |_| {})).unwrap();
    assert_eq!(
        encode(&t, "hello world", false),
        vec![id(&t, "hello"), id(&t, "Ġwo"), id(&t, "r"), id(&t, "l"), id(&t, "d")]
    );
    // Control tokens are split out only when special tokens are parsed.
    assert_eq!(encode(&t, "<|im_start|>hello", true), vec![1, id(&t, "hello")]);
    let literal = encode(&t, "<|im_start|>hello", false);
    assert_eq!(literal.len(), 12 + 1, "{literal:?}");
    assert_eq!(literal[0], id(&t, "<"));
    // User-defined tokens are always split out.
    assert_eq!(encode(&t, "a<think>b", false), vec![id(&t, "a"), id(&t, "<think>"), id(&t, "b")]);
    // Decoding restores the bytes, spaces and non-ASCII included.
    for text in ["hello world", " naïve café ✅\n\tx", "<|im_end|>done"] {
        let ids = encode(&t, text, true);
        assert_eq!(t.tokenizer.decode(&ids, false).unwrap(), text);
    }
    assert_eq!(t.tokenizer.decode(&[1, id(&t, "hello"), 2], true).unwrap(), "hello");
    assert_eq!((t.bos_token.as_deref(), t.eos_token.as_deref()), (Some("<|im_start|>"), Some("<|im_end|>")));
    assert_eq!((t.bos_token_id, t.eos_token_id), (Some(1), Some(2)));
    assert_eq!(t.eos_token_ids, vec![0, 2], "eos plus llama.cpp's end-of-generation texts");
    assert_eq!(t.chat_template.as_deref(), Some("{{ messages }}"));
    assert!(!t.add_bos && !t.add_eos);
}

#[test]
fn pre_tokenizer_follows_tokenizer_ggml_pre() {
    // smollm isolates every digit, so the "1 2" merge never fires; gpt2 keeps
    // runs of digits together and it does.
    let smollm = tokenizer_from_gguf(&synthetic("smollm", |_| {})).unwrap();
    assert_eq!(encode(&smollm, "123", false), vec![id(&smollm, "1"), id(&smollm, "2"), id(&smollm, "3")]);
    let gpt2 = tokenizer_from_gguf(&synthetic("gpt2", |_| {})).unwrap();
    assert_eq!(encode(&gpt2, "123", false), vec![id(&gpt2, "12"), id(&gpt2, "3")]);
    // qwen2 splits digits one by one too, and keeps "\n\n" apart from words.
    let qwen2 = tokenizer_from_gguf(&synthetic("qwen2", |_| {})).unwrap();
    assert_eq!(encode(&qwen2, "123", false).len(), 3);
    // llama3 groups up to three digits, and adds BOS by default.
    let llama3 = tokenizer_from_gguf(&synthetic("llama-bpe", |w| {
        w.metadata("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true));
    }))
    .unwrap();
    assert_eq!(encode(&llama3, "1234", false), vec![id(&llama3, "12"), id(&llama3, "3"), id(&llama3, "4")]);
    assert!(llama3.add_bos);
    let with_bos = llama3.tokenizer.encode("hello", true).unwrap();
    assert_eq!(with_bos.get_ids(), &[1, id(&llama3, "hello")]);
    assert_eq!(llama3.tokenizer.encode("hello", false).unwrap().get_ids(), &[id(&llama3, "hello")]);
    let default = tokenizer_from_gguf(&synthetic("default", |_| {})).unwrap();
    assert_eq!(default.tokenizer.decode(&encode(&default, "x = 1234;", false), false).unwrap(), "x = 1234;");
}

#[test]
fn bad_tokenizer_metadata_is_a_named_error() {
    let err = tokenizer_from_gguf(&synthetic("klingon", |_| {})).unwrap_err();
    assert!(matches!(err, GgufTokenizerError::UnsupportedPreTokenizer { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("`klingon`") && msg.contains("smollm") && msg.contains("llama-bpe") && msg.contains("qwen2"),
        "{msg}"
    );

    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.model", MetadataValue::String("bert".into()));
    }))
    .unwrap_err();
    assert_eq!(err.to_string(), "synthetic.gguf: tokenizer model `bert` is not supported (supported: gpt2, llama)");
    // SentencePiece needs its scores.
    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.model", MetadataValue::String("llama".into()));
    }))
    .unwrap_err();
    assert!(err.to_string().contains("`tokenizer.ggml.scores`"), "{err}");

    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.eos_token_id", MetadataValue::U32(100_000));
    }))
    .unwrap_err();
    assert!(err.to_string().contains("`tokenizer.ggml.eos_token_id`") && err.to_string().contains("100000"), "{err}");

    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(vec![1; 5])));
    }))
    .unwrap_err();
    assert!(err.to_string().contains("`tokenizer.ggml.token_type`"), "{err}");

    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.merges", MetadataValue::Array(MetadataArray::String(vec!["nospace".into()])));
    }))
    .unwrap_err();
    assert!(err.to_string().contains("`tokenizer.ggml.merges`") && err.to_string().contains("entry 0"), "{err}");

    let err = tokenizer_from_gguf(&synthetic("smollm", |w| {
        w.metadata("tokenizer.ggml.tokens", MetadataValue::U32(3));
    }))
    .unwrap_err();
    assert!(err.to_string().contains("`tokenizer.ggml.tokens`: expected an array of strings"), "{err}");
}

/// A SentencePiece BPE model (LLaMA/Mistral settings, byte fallback) trained
/// and written to GGUF by `tests/data/make_spm_case.py`, against what
/// SentencePiece itself encodes and decodes.
#[test]
fn sentencepiece_matches_sentencepiece() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let file = GgufFile::open(dir.join("spm_tiny.gguf")).unwrap();
    let t = tokenizer_from_gguf(&file).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("spm_tiny.json")).unwrap()).unwrap();
    let bos = want["bos_id"].as_u64().unwrap() as u32;
    assert_eq!(t.bos_token_id, Some(bos));
    assert!(t.add_bos);
    let wrapper = engine::text::tokenizer::Tokenizer::new(
        t.tokenizer.clone(),
        engine::text::chat_template::SpecialTokens::default(),
        t.eos_token_ids.clone(),
    );
    let cases = want["cases"].as_array().unwrap();
    let mut byte_fallbacks = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        assert_eq!(encode(&t, text, true), ids, "{text:?}");
        let with_bos = t.tokenizer.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(with_bos, [vec![bos], ids.clone()].concat(), "{text:?} with BOS");
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(t.tokenizer.decode(&ids, true).unwrap(), decoded, "{text:?}");
        // Streamed one token at a time, the text is the same.
        let mut stream = wrapper.decode_stream(true);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.step(&wrapper, id).unwrap());
        }
        streamed.push_str(&stream.finish(&wrapper).unwrap());
        assert_eq!(streamed, decoded, "{text:?} streamed");
        let is_byte = |&i: &u32| t.tokenizer.id_to_token(i).is_some_and(|p| p.starts_with("<0x"));
        byte_fallbacks += usize::from(ids.iter().any(is_byte));
    }
    assert!(byte_fallbacks >= 3, "the cases should exercise byte fallback");
    // A special token in the text is one token when specials are parsed, and
    // the text after it gets the prefix space again (as llama.cpp does).
    let eos = t.eos_token_id.unwrap();
    let eos_text = t.eos_token.clone().unwrap();
    let ids = encode(&t, &format!("hello{eos_text}hello"), true);
    let hello = ids_of(&cases[0]["ids"])[0];
    assert_eq!(ids, [hello, eos, hello]);
}

fn reference() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2-135m-q41/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_matches_llama_cpp() {
    let Some(path) = std::env::var_os("MINISGL_SMOLLM2_GGUF") else {
        eprintln!("skipping smollm2_matches_llama_cpp: set MINISGL_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let file = GgufFile::open(path).unwrap();
    let t = tokenizer_from_gguf(&file).unwrap();
    let r = reference();
    assert_eq!(t.tokenizer.get_vocab_size(true), 49152);
    assert_eq!(t.chat_template.as_deref(), r["chat_template"].as_str());
    assert_eq!((t.bos_token_id, t.eos_token_id, t.pad_token_id, t.unk_token_id), (Some(1), Some(2), Some(2), Some(0)));
    assert_eq!((t.bos_token.as_deref(), t.eos_token.as_deref()), (Some("<|im_start|>"), Some("<|im_end|>")));
    assert!(!t.add_bos, "the GGUF says add_bos_token = false");

    let mut failures = Vec::new();
    let cases = r["tokenization"].as_array().unwrap().iter().chain(r["cases"].as_array().unwrap());
    let mut checked = 0;
    for case in cases {
        let text = case.get("text").or_else(|| case.get("prompt")).and_then(|v| v.as_str()).unwrap();
        let parse_special = case["parse_special"].as_bool().unwrap();
        let want = ids_of(case.get("ids").or_else(|| case.get("prompt_ids")).unwrap());
        let got = encode(&t, text, parse_special);
        if got != want {
            failures.push(format!("{text:?} (parse_special={parse_special}):\n  got  {got:?}\n  want {want:?}"));
        }
        checked += 1;
    }
    assert!(failures.is_empty(), "{} of {checked} cases differ:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(checked, 29 + 6);

    // Greedy continuations decode to the recorded text (special tokens kept).
    for case in r["cases"].as_array().unwrap() {
        let greedy = &case["greedy"];
        let text = t.tokenizer.decode(&ids_of(&greedy["ids"]), false).unwrap();
        assert_eq!(text, greedy["text"].as_str().unwrap(), "{}", case["name"]);
    }
}
