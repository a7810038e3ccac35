"""A Hugging Face causal LM built from a small config (no weights downloaded) in a plain DDP
loop, a script that knows nothing of ddptui. Needs `pip install transformers`.

    ddptui run --auto --nproc-per-node 2 -- examples/train_hf_causal_lm.py --steps 20

--auto times it without a code change: LlamaForCausalLM is opened down to its decoder
layers (`model.embed_tokens`, `model.layers.N`, `model.norm`, `lm_head`).
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    raise SystemExit("train_hf_causal_lm.py needs transformers: pip install transformers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--bucket-cap-mb", type=float, default=1.0)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64)
    model = DDP(LlamaForCausalLM(cfg), bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(a.steps):
        ids = torch.randint(0, cfg.vocab_size, (8, 32))
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
