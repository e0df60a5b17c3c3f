//! A HuggingFace `tokenizers::Tokenizer` rebuilt from GGUF metadata.
//!
//! A GGUF file carries its tokenizer as metadata (`tokenizer.ggml.*`) rather
//! than as a `tokenizer.json`. This module rebuilds the equivalent HF
//! tokenizer so that a GGUF checkpoint tokenizes exactly like llama.cpp (and
//! like the model's original `tokenizer.json`):
//!
//! * `tokenizer.ggml.model = "gpt2"`: byte-level BPE over `tokens` and
//!   `merges`;
//! * `tokenizer.ggml.model = "llama"`: SentencePiece BPE over `tokens` and
//!   `scores` (LLaMA 2, Mistral, TinyLlama; see `sentencepiece_tokenizer`).
//!   Other models (`bert`, `t5`, `rwkv`, ...) are refused.
//! * `tokenizer.ggml.pre` names the pre-tokenizer: the regexes of llama.cpp's
//!   `llm_tokenizer_bpe` for that name, applied one after the other as HF
//!   `Split` pre-tokenizers, then byte-level mapping. See [`PRE_TOKENIZERS`].
//! * `token_type` 3 (control) become special added tokens (matched only when
//!   special tokens are parsed), 4 (user-defined) plain added tokens (always
//!   matched), as llama.cpp's `tokenizer_st_partition` does.
//! * `add_bos_token`/`add_eos_token` become a template post-processor, so
//!   `encode(text, true)` adds them and `encode(text, false)` does not.
//!
//! The caller (the engine's tokenizer wrapper) chooses whether special tokens
//! in the text are parsed with `Tokenizer::set_encode_special_tokens`.

use std::path::PathBuf;

use models::gguf::{GgufError, GgufFile};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::sequence::Sequence as PostSequence;
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::NormalizerWrapper;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

/// A tokenizer and the facts about it that generation needs.
#[derive(Clone, Debug)]
pub struct GgufTokenizer {
    /// The rebuilt tokenizer (decoder included).
    pub tokenizer: Tokenizer,
    /// Text of `tokenizer.ggml.bos_token_id`, for chat templates.
    pub bos_token: Option<String>,
    /// Text of `tokenizer.ggml.eos_token_id`, for chat templates.
    pub eos_token: Option<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// Every id that ends generation: EOS, `eot_token_id`, `eom_token_id`, and
    /// the control tokens llama.cpp treats as end-of-generation by their text
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...). Sorted, unique.
    pub eos_token_ids: Vec<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id` (byte-level BPE never produces it).
    pub unk_token_id: Option<u32>,
    /// Whether prompts start with BOS (`add_bos_token`, else the
    /// pre-tokenizer's llama.cpp default); `encode(_, true)` adds it.
    pub add_bos: bool,
    /// Whether prompts end with EOS (`add_eos_token`).
    pub add_eos: bool,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
}

/// Why a GGUF file's tokenizer could not be rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum GgufTokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{}: tokenizer model `{model}` is not supported (supported: gpt2, llama)", path.display())]
    UnsupportedModel { path: PathBuf, model: String },
    #[error("{}: pre-tokenizer `{pre}` (tokenizer.ggml.pre) is not supported (supported: {})", path.display(), supported.join(", "))]
    UnsupportedPreTokenizer { path: PathBuf, pre: String, supported: Vec<&'static str> },
    #[error("{}: metadata key `{key}`: {reason}", path.display())]
    Invalid { path: PathBuf, key: String, reason: String },
    #[error("{}: building the tokenizer: {reason}", path.display())]
    Build { path: PathBuf, reason: String },
}

/// GPT-2's pre-tokenizer regex as HF's `ByteLevel` writes it (llama.cpp's
/// string lacks the final `|\s+`, which only decides how a lone whitespace
/// before a non-space is split, and its hand-written matcher does the same).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// LLaMA 3's regex (`(?i:...)` spelled out, as llama.cpp does).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's regex: LLaMA 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How llama.cpp pre-tokenizes for one `tokenizer.ggml.pre` family.
#[derive(Clone, Copy, Debug)]
pub struct PreTokenizerSpec {
    /// Regexes applied in turn, each splitting the pieces of the previous one
    /// (HF `Split` with `Isolated` behaviour: matches and gaps both kept).
    pub regexes: &'static [&'static str],
    /// A pre-token found whole in the vocabulary is one token, merges or not
    /// (HF `ignore_merges`, llama.cpp `tokenizer_ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp's `add_bos` default when `add_bos_token` is absent.
    pub add_bos: bool,
}

const SPEC_DEFAULT: PreTokenizerSpec = PreTokenizerSpec {
    regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    ignore_merges: false,
    add_bos: false,
};
const SPEC_GPT2: PreTokenizerSpec = PreTokenizerSpec { regexes: &[GPT2], ignore_merges: false, add_bos: false };
/// StarCoder family (SmolLM included): digits split one by one, then GPT-2;
/// the same as SmolLM's `tokenizer.json` (`Digits(individual) + ByteLevel`).
const SPEC_STARCODER: PreTokenizerSpec =
    PreTokenizerSpec { regexes: &[r"\p{N}", GPT2], ignore_merges: false, add_bos: false };
const SPEC_LLAMA3: PreTokenizerSpec = PreTokenizerSpec { regexes: &[LLAMA3], ignore_merges: true, add_bos: true };
/// SentencePiece files have no pre-tokenizer; llama.cpp adds BOS by default.
const SPEC_SENTENCEPIECE: PreTokenizerSpec = PreTokenizerSpec { regexes: &[], ignore_merges: false, add_bos: true };
/// SentencePiece's visible space, `▁` (U+2581).
const SPIECE_SPACE: &str = "\u{2581}";
const SPEC_QWEN2: PreTokenizerSpec = PreTokenizerSpec { regexes: &[QWEN2], ignore_merges: false, add_bos: false };

/// `tokenizer.ggml.pre` names and their pre-tokenizers, after llama.cpp's
/// `llama_vocab::impl::load` (names) and `llm_tokenizer_bpe` (regexes). The
/// only list of supported names; an unknown name is an error listing these.
pub const PRE_TOKENIZERS: &[(&str, PreTokenizerSpec)] = &[
    ("default", SPEC_DEFAULT),
    ("gpt2", SPEC_GPT2),
    ("gpt-2", SPEC_GPT2),
    ("phi-2", SPEC_GPT2),
    ("mpt", SPEC_GPT2),
    ("olmo", SPEC_GPT2),
    ("llama3", SPEC_LLAMA3),
    ("llama-v3", SPEC_LLAMA3),
    ("llama-bpe", SPEC_LLAMA3),
    ("falcon3", SPEC_LLAMA3),
    ("qwen2", SPEC_QWEN2),
    ("deepseek-r1-qwen", SPEC_QWEN2),
    ("megrez", SPEC_QWEN2),
    ("stablelm2", SPEC_QWEN2),
    ("smollm", SPEC_STARCODER),
    ("starcoder", SPEC_STARCODER),
    ("refact", SPEC_STARCODER),
    ("command-r", SPEC_STARCODER),
    ("codeshell", SPEC_STARCODER),
];

/// llama.cpp's `token_type` values.
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Texts llama.cpp treats as end-of-generation when they are tokens
/// (`llama_vocab::impl::load`, the `special_eog_ids` heuristics).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Rebuilds the tokenizer described by `file`'s `tokenizer.*` metadata.
pub fn tokenizer_from_gguf(file: &GgufFile) -> Result<GgufTokenizer, GgufTokenizerError> {
    let path = file.path().to_path_buf();
    let invalid =
        |key: &str, reason: String| GgufTokenizerError::Invalid { path: path.clone(), key: key.to_owned(), reason };
    let build_err = |reason: String| GgufTokenizerError::Build { path: path.clone(), reason };

    let model = file.get_str("tokenizer.ggml.model")?;
    let sentencepiece = match model {
        "gpt2" => false,
        "llama" => true,
        other => return Err(GgufTokenizerError::UnsupportedModel { path, model: other.to_owned() }),
    };
    let spec = if sentencepiece { SPEC_SENTENCEPIECE } else { gpt2_pre_tokenizer(file)? };

    let tokens = file.get_str_array("tokenizer.ggml.tokens")?;
    let num_tokens = tokens.len();
    let token_types = match file.get("tokenizer.ggml.token_type") {
        Some(_) => file.get_i64_array("tokenizer.ggml.token_type")?,
        None => vec![1; num_tokens],
    };
    if token_types.len() != num_tokens {
        return Err(invalid(
            "tokenizer.ggml.token_type",
            format!("{} entries for {num_tokens} tokens", token_types.len()),
        ));
    }
    let id_of = |i: usize| {
        u32::try_from(i)
            .map_err(|_| invalid("tokenizer.ggml.tokens", format!("{num_tokens} tokens exceed the u32 id range")))
    };

    let mut vocab = Vocab::default();
    let mut duplicates = 0usize;
    for (i, token) in tokens.iter().enumerate() {
        if vocab.contains_key(token) {
            // Keep the first id, as a tokenizer.json vocabulary would.
            duplicates += 1;
            continue;
        }
        vocab.insert(token.clone(), id_of(i)?);
    }
    if duplicates > 0 {
        log::warn!("{}: {duplicates} duplicate token strings; the first id of each is used", path.display());
    }

    let mut tokenizer = if sentencepiece {
        sentencepiece_tokenizer(file, tokens, &token_types, vocab)?
    } else {
        byte_level_tokenizer(file, spec, vocab)?
    };

    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (i, (token, &ty)) in tokens.iter().zip(&token_types).enumerate() {
        if vocab_id(&tokenizer, token) != Some(id_of(i)?) {
            continue; // A later duplicate: not addressable by text.
        }
        match ty {
            TOKEN_TYPE_CONTROL => special.push(AddedToken::from(token.clone(), true)),
            TOKEN_TYPE_UNKNOWN if sentencepiece => special.push(AddedToken::from(token.clone(), true)),
            TOKEN_TYPE_USER_DEFINED => user_defined.push(AddedToken::from(token.clone(), false).normalized(false)),
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&user_defined);

    let token_id = |key: &str| -> Result<Option<u32>, GgufTokenizerError> {
        match file.get_opt::<u32>(key)? {
            Some(id) if (id as usize) < num_tokens => Ok(Some(id)),
            Some(id) => Err(invalid(key, format!("id {id} is outside the {num_tokens}-token vocabulary"))),
            None => Ok(None),
        }
    };
    let bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
    let eos_token_id = token_id("tokenizer.ggml.eos_token_id")?;
    let pad_token_id = token_id("tokenizer.ggml.padding_token_id")?;
    let unk_token_id = token_id("tokenizer.ggml.unknown_token_id")?;
    let eot = token_id("tokenizer.ggml.eot_token_id")?;
    let eom = token_id("tokenizer.ggml.eom_token_id")?;
    let text = |id: Option<u32>| id.map(|i| tokens[i as usize].clone());

    let add_bos = file.get_opt::<bool>("tokenizer.ggml.add_bos_token")?.unwrap_or(spec.add_bos);
    let add_eos = file.get_opt::<bool>("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let bos = if add_bos {
        let id = bos_token_id.ok_or_else(|| {
            invalid("tokenizer.ggml.add_bos_token", "set, but there is no tokenizer.ggml.bos_token_id".into())
        })?;
        Some((id, tokens[id as usize].clone()))
    } else {
        None
    };
    let eos = if add_eos {
        let id = eos_token_id.ok_or_else(|| {
            invalid("tokenizer.ggml.add_eos_token", "set, but there is no tokenizer.ggml.eos_token_id".into())
        })?;
        Some((id, tokens[id as usize].clone()))
    } else {
        None
    };
    let template = template(bos, eos).map_err(build_err)?;
    let post = if sentencepiece {
        template.map(tokenizers::PostProcessorWrapper::from)
    } else {
        let byte_level = tokenizers::PostProcessorWrapper::ByteLevel(ByteLevel::new(false, true, false));
        Some(match template {
            Some(t) => tokenizers::PostProcessorWrapper::Sequence(PostSequence::new(vec![byte_level, t.into()])),
            None => byte_level,
        })
    };
    tokenizer.with_post_processor(post);

    let mut eos_token_ids: Vec<u32> = [eos_token_id, eot, eom].into_iter().flatten().collect();
    for (i, (token, &ty)) in tokens.iter().zip(&token_types).enumerate() {
        if ty == TOKEN_TYPE_CONTROL && EOG_TEXTS.contains(&token.as_str()) {
            eos_token_ids.push(id_of(i)?);
        }
    }
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();

    Ok(GgufTokenizer {
        tokenizer,
        bos_token: text(bos_token_id),
        eos_token: text(eos_token_id),
        bos_token_id,
        eos_token_id,
        eos_token_ids,
        pad_token_id,
        unk_token_id,
        add_bos,
        add_eos,
        chat_template: file.get_opt::<&str>("tokenizer.chat_template")?.map(str::to_owned),
    })
}

/// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): the file's merges, the
/// pre-tokenizer's regexes, then GPT-2's byte-to-unicode mapping.
fn byte_level_tokenizer(
    file: &GgufFile,
    spec: PreTokenizerSpec,
    vocab: Vocab,
) -> Result<Tokenizer, GgufTokenizerError> {
    let path = file.path().to_path_buf();
    let invalid =
        |key: &str, reason: String| GgufTokenizerError::Invalid { path: path.clone(), key: key.to_owned(), reason };
    let build_err = |reason: String| GgufTokenizerError::Build { path: path.clone(), reason };
    let mut merges = Vec::new();
    let mut skipped = 0usize;
    if file.contains_key("tokenizer.ggml.merges") {
        for (i, merge) in file.get_str_array("tokenizer.ggml.merges")?.iter().enumerate() {
            // As llama.cpp: split at the first space after the first byte.
            // (A space byte is always a char boundary, so the slices below are valid.)
            let split = merge.bytes().enumerate().skip(1).find(|&(_, b)| b == b' ').map(|(p, _)| p);
            let Some(at) = split else {
                return Err(invalid(
                    "tokenizer.ggml.merges",
                    format!("entry {i} ({merge:?}) is not two tokens separated by a space"),
                ));
            };
            let (a, b) = (&merge[..at], &merge[at + 1..]);
            // A merge whose parts or result are not tokens can never fire;
            // llama.cpp keeps it harmlessly, HF's builder would refuse it.
            if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")) {
                merges.push((a.to_owned(), b.to_owned()));
            } else {
                skipped += 1;
            }
        }
    }
    if skipped > 0 {
        log::warn!("{}: {skipped} merges refer to tokens outside the vocabulary; skipped", path.display());
    }

    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| build_err(format!("byte-level BPE: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);

    let mut pieces = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in spec.regexes {
        let split = Split::new(SplitPattern::Regex((*regex).to_owned()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| build_err(format!("pre-tokenizer regex {regex:?}: {e}")))?;
        pieces.push(PreTokenizerWrapper::Split(split));
    }
    pieces.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)));
    tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(PreSequence::new(pieces))));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, false)));
    Ok(tokenizer)
}

/// SentencePiece BPE (`tokenizer.ggml.model = "llama"`: LLaMA 1/2, Mistral,
/// TinyLlama, ...) as transformers' `LlamaTokenizerFast` holds it, which
/// tokenizes like llama.cpp's `llm_tokenizer_spm`:
///
/// * spaces become `▁`, and each stretch of text between special tokens gets a
///   leading `▁` (`add_space_prefix`, default on; llama.cpp prefixes after
///   every special token too);
/// * pieces merge by the score of the merged piece, highest first: the merges
///   are every split of a normal piece into two pieces of the vocabulary,
///   ranked by the piece's score (transformers' `SentencePieceExtractor`);
/// * a character with no piece becomes its UTF-8 bytes (`<0xXX>` tokens).
///
/// Decoding undoes each step and drops the prefix space.
fn sentencepiece_tokenizer(
    file: &GgufFile,
    tokens: &[String],
    token_types: &[i64],
    vocab: Vocab,
) -> Result<Tokenizer, GgufTokenizerError> {
    let path = file.path().to_path_buf();
    let build_err = |reason: String| GgufTokenizerError::Build { path: path.clone(), reason };
    let scores = file.get_f32_array("tokenizer.ggml.scores")?;
    if scores.len() != tokens.len() {
        return Err(GgufTokenizerError::Invalid {
            path: path.clone(),
            key: "tokenizer.ggml.scores".into(),
            reason: format!("{} scores for {} tokens", scores.len(), tokens.len()),
        });
    }
    // (score, piece id, left id, right id) -> (left, right); sorted as the
    // reference ranks them: score descending, then piece, then the parts' ids.
    let mut ranked = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if token_types[id] != TOKEN_TYPE_NORMAL || vocab.get(piece) != Some(&(id as u32)) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                ranked.push((scores[id], id, l, r, left.to_owned(), right.to_owned()));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3)));
    let merges = ranked.into_iter().map(|m| (m.4, m.5)).collect();

    let unk = file.get_opt::<u32>("tokenizer.ggml.unknown_token_id")?.and_then(|id| tokens.get(id as usize)).cloned();
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder.build().map_err(|e| build_err(format!("SentencePiece BPE: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);

    let add_space_prefix = file.get_opt::<bool>("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let spaces = Replace::new(" ", SPIECE_SPACE).map_err(|e| build_err(e.to_string()))?;
    let normalizer: NormalizerWrapper = if add_space_prefix {
        NormSequence::new(vec![Prepend::new(SPIECE_SPACE.into()).into(), spaces.into()]).into()
    } else {
        spaces.into()
    };
    tokenizer.with_normalizer(Some(normalizer));
    let mut steps: Vec<DecoderWrapper> = vec![
        Replace::new(SPIECE_SPACE, " ").map_err(|e| build_err(e.to_string()))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        steps.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(steps)));
    Ok(tokenizer)
}

/// The pre-tokenizer named by `tokenizer.ggml.pre` of a byte-level BPE file.
fn gpt2_pre_tokenizer(file: &GgufFile) -> Result<PreTokenizerSpec, GgufTokenizerError> {
    let path = file.path();
    Ok(match file.get_opt::<&str>("tokenizer.ggml.pre")? {
        Some(pre) => match PRE_TOKENIZERS.iter().find(|(name, _)| *name == pre) {
            Some((_, spec)) => *spec,
            None => {
                return Err(GgufTokenizerError::UnsupportedPreTokenizer {
                    path: path.to_path_buf(),
                    pre: pre.to_owned(),
                    supported: PRE_TOKENIZERS.iter().map(|p| p.0).collect(),
                })
            }
        },
        None => {
            log::warn!("{}: no tokenizer.ggml.pre; using llama.cpp's `default` pre-tokenizer", path.display());
            SPEC_DEFAULT
        }
    })
}

/// The id the BPE model gives `token`, to tell a token's first occurrence
/// from a later duplicate.
fn vocab_id(tokenizer: &Tokenizer, token: &str) -> Option<u32> {
    use tokenizers::Model;
    tokenizer.get_model().token_to_id(token)
}

/// `[BOS] $A [EOS]` (each part only when enabled) for single sequences, and
/// the same around `$B` for pairs; `None` when neither is enabled. Template
/// keys are `BOS`/`EOS`, so token texts containing `:` or spaces are fine.
fn template(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> Result<Option<TemplateProcessing>, String> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Vec::new();
    if let Some((id, text)) = bos.clone() {
        single.push("BOS".to_owned());
        pair.push("BOS".to_owned());
        specials.push(SpecialToken::new("BOS".into(), vec![id], vec![text]).map_err(|e| e.to_string())?);
    }
    single.push("$A".into());
    pair.push("$A".into());
    if let Some((id, text)) = eos.clone() {
        single.push("EOS".into());
        pair.push("EOS".into());
        specials.push(SpecialToken::new("EOS".into(), vec![id], vec![text]).map_err(|e| e.to_string())?);
    }
    if bos.is_some() {
        pair.push("BOS:1".into());
    }
    pair.push("$B:1".into());
    if eos.is_some() {
        pair.push("EOS:1".into());
    }
    TemplateProcessing::builder()
        .try_single(single)?
        .try_pair(pair)?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| e.to_string())
}
