"""A serving-like loop that mixes a CUDA graph with eager kernels: a decoder's layers captured
once and replayed every step, an eager front end (its own layers) before each replay, and a
synchronization per step (the token read back, as a server samples). Every byte the graph
touches is reached only through `cudaGraphLaunch`, never through a kernel launch of its own.

Prints the digest of the accumulated outputs, the peak, and the median step time after warm-up
(`step_s`). `GRAPH_STEPS` (200), `GRAPH_LAYERS` (12) and `GRAPH_EAGER_LAYERS` (4) change it."""
import os
import time

import torch

from common import report

steps = int(os.environ.get("GRAPH_STEPS", "200"))
layers = int(os.environ.get("GRAPH_LAYERS", "12"))
eager_layers = int(os.environ.get("GRAPH_EAGER_LAYERS", "4"))
width, batch = 4096, 64

torch.manual_seed(0)
decoder = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda().eval()
front = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(eager_layers)]).cuda().eval()
static_in = torch.zeros(batch, width, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(side):
    for _ in range(3):  # warm up on a side stream before capturing, as PyTorch asks
        decoder(static_in)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_out = torch.tanh(decoder(static_in))

gen = torch.Generator(device="cuda").manual_seed(1)
total = torch.zeros(batch, width, device="cuda")
tokens, seconds = [], []
with torch.no_grad():
    for step in range(steps):
        started = time.perf_counter()
        x = torch.randn(batch, width, device="cuda", generator=gen)
        static_in.copy_(torch.tanh(front(x)))
        graph.replay()
        total += static_out
        tokens.append(int(static_out[0].argmax().item()))  # the step's synchronization
        seconds.append(time.perf_counter() - started)
torch.cuda.synchronize()
steady = sorted(seconds[steps // 4:])
report("graph_serving", total.cpu().numpy().tobytes() + bytes(str(tokens), "ascii"), torch.cuda.max_memory_reserved(),
       step_s=round(steady[len(steady) // 2], 5))
