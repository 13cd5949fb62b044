"""Python peer of benches/attnlrp.rhai: AttnLRP head relevance with LXT 2.1's efficient patches
(the loading and hooks of tests/fixtures/attnlrp_reference.py) on the same model and sentences,
one backward per sentence with the same seeds as headscope's `seeds: "summed"`: MiniLM, the
final hidden states at the real positions (R = h * h; [CLS]/[SEP] not seeded); SmolLM2, the sum
of every position's top-1 next-token logit.
Per layer each head's share of sum |R_h|, averaged over sentences (headscope's grid).

Usage: attnlrp_peer.py minilm|smollm2 N   -> one JSON line on stdout
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
import attnlrp_reference as ref  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def load(name):
    if name == "minilm":
        import transformers.models.bert.modeling_bert as mb
        ref.monkey_patch(mb, verbose=False)
        model = mb.BertModel.from_pretrained(ref.MINILM, dtype=torch.float32, attn_implementation="eager").eval()
        tok = Tokenizer.from_file(os.path.join(ref.MINILM, "tokenizer.json"))
        outs = [layer.attention.output.dense for layer in model.encoder.layer]
        embed = model.embeddings.word_embeddings
    else:
        import subprocess
        if not os.path.exists(os.path.join(ref.SMOL_HF, "model.safetensors")):
            subprocess.run([sys.executable, os.path.join(ref.ROOT, "tests", "fixtures", "export_smollm2_hf.py"), ref.SMOL_SRC, ref.SMOL_HF], check=True)
        from transformers.models.llama import modeling_llama as ml
        ref.monkey_patch(ml, verbose=False)
        model = ml.LlamaForCausalLM.from_pretrained(ref.SMOL_HF, dtype=torch.float32, attn_implementation="eager").eval()
        tok = Tokenizer.from_file(os.path.join(ref.SMOL_HF, "tokenizer.json"))
        outs = [layer.self_attn.o_proj for layer in model.model.layers]
        embed = model.model.embed_tokens
    model.requires_grad_(False)
    tok.no_padding()
    tok.no_truncation()
    return model, tok, outs, embed


def main():
    name, n = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(os.cpu_count())
    model, tok, outs, embed = load(name)
    store, _ = ref.capture_o_proj_inputs(outs)
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    lines = [l.strip() for l in open(ref.SENTENCES, encoding="utf-8") if l.strip()][:n]

    def one(s):
        enc = tok.encode(s)
        ids = torch.tensor([enc.ids])
        emb = embed(ids).detach().requires_grad_(True)
        if name == "minilm":
            h = model(inputs_embeds=emb, token_type_ids=torch.zeros_like(ids)).last_hidden_state
            # Real positions only: [CLS] and [SEP] are not seeded (docs/methods.md#attnlrp).
            real = 1.0 - torch.tensor([enc.special_tokens_mask], dtype=h.dtype)
            h.backward(gradient=h.detach() * real[..., None])
        else:
            logits = model(inputs_embeds=emb, use_cache=False).logits[0, :-1]
            logits.max(-1).values.sum().backward()
        shares = []
        for l in range(L):
            x = store[l]
            r = (x.detach() * x.grad)[0].reshape(x.shape[1], H, -1).sum(dim=(0, 2)).abs()
            shares.append((r / r.sum()).tolist())
        return shares

    one(lines[0])  # warm-up
    total = [[0.0] * H for _ in range(L)]
    start = time.perf_counter()
    for s in lines:
        for l, row in enumerate(one(s)):
            for h, v in enumerate(row):
                total[l][h] += v / n
    secs = time.perf_counter() - start
    print(json.dumps({"bench": "attnlrp_peer", "model": name, "sentences": n, "seconds": secs, "check": total[0][:3]}))


if __name__ == "__main__":
    main()
