"""(tests) An encoder-decoder from Hugging Face built from a small config (T5: 3 + 3 blocks,
no weights downloaded) in a plain DDP loop, nothing of ddptui. Needs transformers.

    --steps N   optimizer steps (default 6)
    --batch B   sequences a rank, a step (default 4)
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import T5Config, T5ForConditionalGeneration

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--batch", type=int, default=4)
a = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
cfg = T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=3, num_decoder_layers=3,
               num_heads=4, decoder_start_token_id=0, pad_token_id=0)
model = DDP(T5ForConditionalGeneration(cfg))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(dist.get_rank())
for _ in range(a.steps):
    src = torch.randint(1, 256, (a.batch, 16), generator=g)
    tgt = torch.randint(1, 256, (a.batch, 8), generator=g)
    opt.zero_grad()
    model(input_ids=src, labels=tgt).loss.backward()
    opt.step()
dist.destroy_process_group()
