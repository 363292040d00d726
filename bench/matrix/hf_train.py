"""Training with Hugging Face transformers, unmodified: GPT-2 medium's shape (24 layers, 1024
wide, random weights from a seed), bf16 autocast, AdamW, batches of 8 x 512 tokens, 10 steps
each ending with `loss.item()`; the digest is the losses and a slice of the weights."""
import sys

import torch

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:
    print('{"skipped": "transformers is not installed"}')
    sys.exit(0)

from common import report, train

torch.manual_seed(0)
config = GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024, attn_implementation="eager")
model = GPT2LMHeadModel(config).cuda().train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = torch.Generator(device="cuda").manual_seed(1)


def loss_of(_step):
    batch = torch.randint(0, config.vocab_size, (8, 512), device="cuda", generator=data)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(batch, labels=batch).loss


losses, step_s = train(10, loss_of, optimizer)
weights = model.transformer.h[-1].mlp.c_fc.weight.detach().float().cpu().numpy().tobytes()
report("hf_train", repr(losses).encode() + weights, torch.cuda.max_memory_reserved(), step_s=step_s, losses=losses)
