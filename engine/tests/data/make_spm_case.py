"""Makes the SentencePiece test case of engine/tests/gguf_tokenizer.rs.

Trains a tiny SentencePiece BPE model the way LLaMA's and Mistral's were set up
(identity normalisation, a dummy prefix space, whitespace kept, digits split,
byte fallback), writes its vocabulary into a GGUF file the way llama.cpp's
convert_hf_to_gguf.py does for `tokenizer.model` (tokenizer.ggml.model =
"llama": tokens, scores, token types), and records what SentencePiece itself
makes of a list of texts: the ids (no BOS) and the decoded text.

    pip install sentencepiece==0.2.3 gguf==0.19.0
    python3 engine/tests/data/make_spm_case.py

Outputs, committed: spm_tiny.gguf and spm_tiny.json beside this script.
"""

import io
import json
import os
import random

import gguf
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))

WORDS = (
    "the quick brown fox jumps over the lazy dog while a tiny model learns to read "
    "tokens pieces merges scores bytes and spaces in between hello world again "
    "serving language models on graphics cards is fast when kernels are good"
).split()


def corpus():
    rng = random.Random(0)
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, n), str(rng.randint(0, 99999)))
        if rng.random() < 0.2:
            words[0] = words[0].capitalize()
        sep = "  " if rng.random() < 0.1 else " "
        lines.append(sep.join(words) + rng.choice([".", "!", "?", ",", ""]))
    return "\n".join(lines)


TEXTS = [
    "hello world",
    "Hello world!",
    " the quick brown fox",
    "the  lazy   dog",
    "serving language models on graphics cards is fast",
    "12345 apples and 67 pears",
    "tabs\tand\nnewlines\n\nkept",
    "café naïve résumé",
    "日本語のテキスト",
    "emoji 🎉🚀 party",
    "mixedCASE wordsWithoutSpaces",
    "   leading and trailing spaces   ",
    "a",
    "",
    "punctuation!? ... --- ,,,",
    "kernels are good when models learn",
]


def main():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus().split("\n")),
        model_writer=model,
        model_type="bpe",
        vocab_size=600,
        character_coverage=1.0,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        split_digits=True,
        byte_fallback=True,
        allow_whitespace_only_pieces=True,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        user_defined_symbols=["<tool>"],
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())

    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        tokens.append(piece.encode("utf-8"))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_unused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        elif piece == "<tool>":
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)

    path = os.path.join(HERE, "spm_tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    cases = [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in TEXTS]
    with open(os.path.join(HERE, "spm_tiny.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_id": sp.bos_id(), "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
