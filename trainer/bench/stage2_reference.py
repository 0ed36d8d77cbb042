"""The PyTorch + PEFT reference for `care-train gpu-check`: the same Stage II step, timed on the same GPU.

Same shapes as the trainer's `qwen3-0.6b` case: a random Qwen3-Embedding-0.6B-shaped document encoder in bf16 with
LoRA r = 32, alpha = 64 on q/k/v/o/gate/up/down (PEFT keeps the adapters in fp32), a random e5-small-shaped
(XLM-R, 12 x 384) query encoder trained fully in fp32, both under bf16 autocast with SDPA attention; B queries of
`query_len` tokens, 8 documents of `doc_len` tokens each (no padding), mean pooling for queries, last token for
documents, InfoNCE at t = 0.02 over the query width in fp32, AdamW (foreach, torch's default on CUDA), clipping at
1.0. Step times after two warm-up steps, peak memory as torch's allocator counts it and as the device reports it
(`mem_get_info`, the number care-train reports).

    python3 stage2_reference.py --json reference.json --batches 4,8 --steps 10
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def build(doc_len, query_len):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3Model, XLMRobertaConfig, XLMRobertaModel

    dcfg = Qwen3Config(vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                       rope_theta=1_000_000.0, max_position_embeddings=32768, attention_dropout=0.0)
    dcfg._attn_implementation = "sdpa"
    qcfg = XLMRobertaConfig(vocab_size=250037, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=1536, max_position_embeddings=514, type_vocab_size=1,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0)
    qcfg._attn_implementation = "sdpa"
    torch.manual_seed(11)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        doc = Qwen3Model(dcfg)
    torch.set_default_dtype(prev)
    doc.requires_grad_(False)
    doc = get_peft_model(doc, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0,
                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"]))
    with torch.device("cuda"):
        query = XLMRobertaModel(qcfg, add_pooling_layer=False)
    doc.train()
    query.train()
    return doc, query


def step_fn(doc, query, opt, params, batch, doc_len, query_len):
    g = 8
    qids = torch.randint(2, 4096, (batch, query_len), device="cuda")
    dids = torch.randint(2, 4096, (batch * g, doc_len), device="cuda")
    dids[:, -1] = 1  # the end-of-text token, as care-train appends it
    qmask = torch.ones_like(qids)
    dmask = torch.ones_like(dids)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            qh = query(input_ids=qids, attention_mask=qmask).last_hidden_state
            q = (qh * qmask.unsqueeze(-1)).sum(1) / qmask.sum(1, keepdim=True)
            d = doc(input_ids=dids, attention_mask=dmask).last_hidden_state[:, -1]
        q = F.normalize(q.float(), dim=-1)
        d = F.normalize(d.float()[:, : q.shape[1]], dim=-1)
        scores = q @ d.T / 0.02
        loss = F.cross_entropy(scores, torch.arange(batch, device="cuda") * g)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()

    return step


def case(batch, steps, doc_len, query_len):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    free, total = torch.cuda.mem_get_info()
    base = total - free
    doc, query = build(doc_len, query_len)
    params = [p for p in list(query.parameters()) + list(doc.parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.05)
    step = step_fn(doc, query, opt, params, batch, doc_len, query_len)
    times, losses = [], []
    for i in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    free, total = torch.cuda.mem_get_info()
    out = {
        "batch": batch, "documents": batch * 8, "doc_len": doc_len, "query_len": query_len,
        "step_seconds_median": statistics.median(times), "step_seconds_min": min(times),
        "step_seconds_max": max(times), "losses": losses,
        "max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20,
        "max_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
        "device_used_mib": (total - free - base) / 2**20,
        "trainable_params": sum(p.numel() for p in params),
        "lora_params": sum(p.numel() for n, p in doc.named_parameters() if "lora_" in n),
    }
    del doc, query, opt, params, step
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--batches", default="4,8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--doc-len", type=int, default=256)
    ap.add_argument("--query-len", type=int, default=32)
    a = ap.parse_args()
    import peft
    import transformers
    report = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
              "gpu": torch.cuda.get_device_name(0), "cases": []}
    for b in [int(x) for x in a.batches.split(",")]:
        try:
            r = case(b, a.steps, a.doc_len, a.query_len)
        except Exception as e:  # one failed case must not lose the others
            r = {"batch": b, "error": repr(e)}
        print(json.dumps(r), flush=True)
        report["cases"].append(r)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
