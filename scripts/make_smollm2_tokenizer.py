"""Derive tokenizer.json for the SmolLM2 GGUF (its vocabulary and merges live in the GGUF
metadata) with transformers' GGUF conversion. Usage: make_smollm2_tokenizer.py DIR
Written atomically next to the .gguf; no network is used."""
import glob
import os
import shutil
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoTokenizer


def main():
    d = sys.argv[1]
    ggufs = glob.glob(os.path.join(d, "*.gguf"))
    if len(ggufs) != 1:
        sys.exit(f"{d}: expected one .gguf file, found {len(ggufs)}")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=os.path.basename(ggufs[0]))
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        tok.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "tokenizer.json"), os.path.join(d, "tokenizer.json.tmp"))
    os.replace(os.path.join(d, "tokenizer.json.tmp"), os.path.join(d, "tokenizer.json"))
    print(f"wrote {os.path.join(d, 'tokenizer.json')}")


if __name__ == "__main__":
    main()
