"""A CUDA-graph replay: an MLP's forward captured once, replayed 50 times on new inputs."""
import torch

from common import report

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda().eval()
static_in = torch.zeros(256, 4096, device="cuda")
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(stream):
    for _ in range(3):  # warm up on a side stream, as PyTorch asks before capturing
        model(static_in)
torch.cuda.current_stream().wait_stream(stream)
graph = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(graph):
    static_out = model(static_in)
gen = torch.Generator(device="cuda").manual_seed(1)
total = torch.zeros(256, 4096, device="cuda")
for _ in range(50):
    static_in.copy_(torch.randn(256, 4096, device="cuda", generator=gen))
    graph.replay()
    total += static_out
torch.cuda.synchronize()
report("cuda_graph_replay", total.cpu().numpy().tobytes(), torch.cuda.max_memory_reserved())
