"""(tests) A small GPT-like model under torch.compile, trained with DDP on gloo, the ways real
scripts do it: nanoGPT compiles the model and wraps the compiled model in DDP ("inside");
others compile the DDP module ("outside"). Rank 0 prints, at the end, what torch._dynamo
counted: `GRAPH_BREAKS n` and `GRAPHS n` (frames compiled). Nothing of ddptui (run it under
`ddptui run --auto`, or alone with torchrun: the counts must be the same).

    --iters N       optimizer steps (default 8)
    --wrap W        inside (default): DDP(torch.compile(model)); outside: torch.compile(DDP(model));
                    none: torch.compile(model), no DDP (the gradients all-reduced by hand)
    --backend B     torch.compile's backend (default inductor)
    --traced-coll   the model's forward all_reduces a statistic of its activations with a
                    functional collective (torch.distributed._functional_collectives), which
                    torch.compile traces into its graph
    --blocks N      the tiny GPT's blocks (default 4)
    --model M       tiny (default): the GPT above; gpt2 or bert: a Hugging Face transformers
                    model built from a small config (2 layers, width 64: no download), called
                    as the HF Trainer calls it (keyword arguments, the loss from its output)
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.proj(F.gelu(self.fc(self.ln(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=512, d=64, n=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.h:
            x = b(x)
        if TRACED_COLL:  # (a statistic of the activations, summed over the ranks, in the graph)
            import torch.distributed._functional_collectives as funcol
            s = funcol.all_reduce(x.detach().mean().reshape(1), "sum", dist.group.WORLD)
            x = x + 0 * s
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=8)
p.add_argument("--wrap", choices=("inside", "outside", "none"), default="inside")
p.add_argument("--backend", default="inductor")
p.add_argument("--traced-coll", action="store_true")
p.add_argument("--model", choices=("tiny", "gpt2", "bert"), default="tiny")
p.add_argument("--blocks", type=int, default=4)
a = p.parse_args()
TRACED_COLL = a.traced_coll
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
VOCAB = 512 if a.model == "tiny" else 128


def hf_model(kind):
    import transformers as tr
    if kind == "gpt2":
        cfg = tr.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64)
        m = tr.GPT2LMHeadModel(cfg)
    else:
        cfg = tr.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                            intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
        m = tr.BertForMaskedLM(cfg)
    m.config.use_cache = False
    return m


model = TinyGPT(n=a.blocks) if a.model == "tiny" else hf_model(a.model)
if a.wrap == "inside":
    model = DDP(torch.compile(model, backend=a.backend))
elif a.wrap == "outside":
    model = torch.compile(DDP(model), backend=a.backend)
else:
    model = torch.compile(model, backend=a.backend)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
idx = torch.randint(0, VOCAB, (4, 33), generator=g)
for it in range(a.iters):
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    if a.model == "tiny":
        loss = model(x, y)
    else:  # (the HF Trainer's way: keyword arguments, the loss from the output)
        loss = model(input_ids=x, labels=y).loss
    loss.backward()
    if a.wrap == "none":
        for q in model.parameters():
            dist.all_reduce(q.grad)
    opt.step()
    opt.zero_grad(set_to_none=True)
if rank == 0:
    from torch._dynamo.utils import counters
    print(f"GRAPH_BREAKS {sum(counters['graph_break'].values())}")
    print(f"GRAPHS {counters['stats']['unique_graphs']}")
    for why, n in counters["graph_break"].items():
        print(f"BREAK {n} {why[:200]!r}")
dist.destroy_process_group()
