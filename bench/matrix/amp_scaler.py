"""Mixed-precision training with `torch.amp.GradScaler`, unmodified: fp16 autocast, the scaler's
inf/NaN checks (`_amp_foreach_non_finite_check_and_unscale_`, a device-side flag read by the
optimizer step), gradient clipping, and a learning-rate schedule — what most fp16 training
scripts do. An MLP stack trained 12 steps; the digest is the losses, the scale and a slice of the
weights."""
import torch
from torch import nn

from common import report, train

torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(4096, 4096), nn.GELU()) for _ in range(10)], nn.Linear(4096, 1)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16)
data = torch.Generator(device="cuda").manual_seed(1)
losses = []
for step in range(12):
    x = torch.randn(2048, 4096, device="cuda", generator=data)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().square().mean()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
weights = model[0][0].weight.detach().float().cpu().numpy().tobytes()
report("amp_scaler", repr((losses, scaler.get_scale())).encode() + weights, torch.cuda.max_memory_reserved(), losses=losses)
