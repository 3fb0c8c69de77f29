"""Build the bundled byte-level BPE tokenizer of the tiny default model from this repo's own text.

    python scripts/build_tokenizer.py [--vocab-size 4096]

Writes hljax/assets/tokenizer/. The committed files are canonical: rebuilding after the repo's text
changed gives a different tokenizer, so only rebuild together with every tiny checkpoint you keep.
"""

import argparse
import json
import os
import subprocess

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hljax.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "hljax", "assets", "tokenizer")
def repo_text() -> list[str]:
    """Every tracked .py and .md file, and the text of the bundled JSONL data (prompts, edits)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "data/*.jsonl"], cwd=ROOT, capture_output=True,
                           text=True, check=True)
    texts = []
    for name in sorted(files.stdout.split()):
        with open(os.path.join(ROOT, name), encoding="utf-8", errors="replace") as f:
            if name.endswith(".jsonl"):
                for line in f:
                    row = json.loads(line)
                    texts += [m["content"] for m in row.get("messages", [])] + [row.get("completion", "")]
            else:
                texts.append(f.read())
    return texts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=8192)
    args = parser.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(repo_text(), trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    fast.save_pretrained(OUT)
    print(f"wrote {OUT}: {tok.get_vocab_size()} tokens")


if __name__ == "__main__":
    main()
