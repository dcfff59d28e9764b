#!/usr/bin/env python3
"""Builds the byte-level BPE test fixture: a GPT-NeoX-style tokenizer.json and the token ids the
Hugging Face `tokenizers` library (the reference implementation) gives for a set of test texts.

The tokenizer is trained here, with the tokenizers library, on the Python standard library's own
source files (*.py of the interpreter that runs this script; Python Software Foundation License
v2; no download), configured like GPT-NeoX's tokenizer.json: BPE model, ByteLevel pre-tokenizer
(GPT-2 split pattern, no prefix space), ByteLevel decoder, the NeoX special tokens as added tokens.
No public Mamba-2 tokenizer.json is available offline, so this is the closest check of
replayssm's own BPE (src/model/tokenizer.cpp) against the library that produced those files.

Outputs (under --out):
  tokenizer.json   the trained tokenizer, saved by the library
  expected.json    {"library": "tokenizers X.Y", "cases": [{"text": ..., "ids": [...]}, ...]}

Run: python3 scripts/make_bpe_fixture.py --out tests/data/bpe  (needs `pip install tokenizers`).
"""
import argparse
import glob
import json
import os
import sysconfig

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Texts the test encodes: code, prose, contractions, digits, whitespace runs, punctuation, the
# special tokens inside text, non-ASCII letters, and characters that are neither letters nor
# digits (GPT-2's split pattern classes them apart from letters).
CASES = [
    "def main(argv):\n    return 0\n",
    "import os\nimport sys\n\n\nclass Parser(object):\n    \"\"\"Parse the input.\"\"\"\n",
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they'll see we've done what he'd said it's for.",
    "  leading spaces, trailing spaces   \n\n\ttabs\t\tand\r\nnewlines  ",
    "numbers 0 1 12 123 1234 12345 3.14159 -2e10 0x1F",
    "punctuation!!! ??? ... --- *** ((())) {[<>]} ''' \"\"\"",
    "for i in range(10):\n        if i % 2 == 0:\n            print(f'{i:03d}')\n",
    "<|endoftext|>",
    "first document<|endoftext|>second document",
    "<|padding|><|padding|> padded",
    "caf\u00e9 na\u00efve \u00dcn\u00efc\u00f6d\u00e9 r\u00e9sum\u00e9 \u00e5ngstr\u00f6m",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587 \ud55c\uad6d\uc5b4",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, \u043c\u0438\u0440!",
    "emoji \U0001F600 ok \U0001F44D\U0001F3FD",
    "ab\U0001F600cd x\u00a0y \u2014 dash \u201cquoted\u201d 5\u00b0C \u20ac10",
    "  \n",
    "",
    "a",
    "'s 't 're 've 'm 'll 'd 'S 'T",
    "x" * 300,
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=2048)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    tok.save(os.path.join(args.out, "tokenizer.json"))

    cases = []
    for text in CASES:
        enc = tok.encode(text, add_special_tokens=False)
        round_trip = tok.decode(enc.ids, skip_special_tokens=False) == text
        cases.append({"text": text, "ids": enc.ids, "decodes_back": round_trip})
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"library": f"tokenizers {tokenizers.__version__}",
                   "trained_on": f"{len(files)} stdlib *.py files", "cases": cases},
                  f, ensure_ascii=True, indent=1)
    print(f"vocab {tok.get_vocab_size()}, {len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
