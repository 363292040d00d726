"""Two CUDA streams at once: a side stream computes while the main one does, joined by events
and `record_stream`, never a device-wide synchronization until the end; the digest is the
result."""
import torch

from common import report

torch.manual_seed(0)
side = torch.cuda.Stream()
weights = [torch.randn(4096, 4096, device="cuda") / 64 for _ in range(16)]  # 1 GiB
x = torch.randn(2048, 4096, device="cuda")
total = torch.zeros(2048, 4096, device="cuda")
for round_ in range(200):
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x
        for w in weights[:8]:
            y = torch.tanh(y @ w)
    y.record_stream(torch.cuda.current_stream())  # made on the side stream, used on this one
    z = x
    for w in weights[8:]:
        z = torch.tanh(z @ w)
    torch.cuda.current_stream().wait_stream(side)
    x = (y + z) / 2
    total += x
torch.cuda.synchronize()
report("two_streams", total.cpu().numpy().tobytes(), torch.cuda.max_memory_reserved())
