"""Greedy decoding with Hugging Face transformers, unmodified: a Llama-style model (random
weights from a seed, bf16, ~4 GiB), 4 prompts of 128 tokens, 64 new tokens each, the KV cache
growing every token; the digest is the tokens generated. An inference program whose weights,
under a budget, do not all fit: each token reads every weight once."""
import sys
import time

import torch

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:
    print('{"skipped": "transformers is not installed"}')
    sys.exit(0)

from common import report

torch.manual_seed(0)
config = LlamaConfig(vocab_size=32000, hidden_size=2560, intermediate_size=6912, num_hidden_layers=24,
                     num_attention_heads=20, num_key_value_heads=20, max_position_embeddings=2048,
                     attn_implementation="eager")
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(config).eval()
model.generation_config.eos_token_id = None  # random weights: never stop early
model.generation_config.pad_token_id = 0
prompts = torch.randint(3, config.vocab_size, (4, 128), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
with torch.no_grad():
    model.generate(prompts, max_new_tokens=4, do_sample=False)  # warm-up
    torch.cuda.synchronize()
    started = time.perf_counter()
    tokens = model.generate(prompts, max_new_tokens=64, do_sample=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
report("hf_decode", tokens.cpu().numpy().tobytes(), torch.cuda.max_memory_reserved(),
       tokens_per_s=round(4 * 64 / seconds, 2), decode_s=round(seconds, 3))
