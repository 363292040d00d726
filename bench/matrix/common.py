"""Shared by the coverage matrix's programs (bench/transparent_matrix.py): each prints one JSON
line with the digest of what it computed (bitwise: a sha256 of the result's bytes) and the most
GPU memory it held, and nothing else on stdout."""
import hashlib
import json


def report(name, result_bytes, peak_bytes, **extra):
    print(json.dumps({"program": name, "digest": hashlib.sha256(result_bytes).hexdigest(), "peak_bytes": int(peak_bytes), **extra}), flush=True)


def reproducible_digest(ops, to_bytes, synchronize, keep):
    """Runs each of `ops` (name -> a function computing a result) twice: the sha256 over the
    results computed twice bitwise alike, and the names of those that were not (a library free
    to pick another algorithm per call would make a capped run differ for reasons of its own,
    not tiermem's). The first results go into `keep`, so that they stay allocated."""
    import hashlib

    digest, unstable = hashlib.sha256(), []
    for name, op in ops.items():
        first = op()
        keep.append(first)
        again = op()
        synchronize()
        first_bytes = to_bytes(first)
        if first_bytes == to_bytes(again):
            digest.update(name.encode() + first_bytes)
        else:
            unstable.append(name)
    return digest.digest(), unstable


def train(steps, loss_of, optimizer, warm=2):
    """Runs `steps` training steps: `loss_of(step)` makes the batch and the loss, then backward,
    the optimizer's step and `loss.item()` (the synchronization a training loop makes). The
    losses, and the median time of a step after the first `warm`."""
    import time

    losses, seconds = [], []
    for step in range(steps):
        started = time.perf_counter()
        loss = loss_of(step)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seconds.append(time.perf_counter() - started)
    steady = sorted(seconds[warm:])
    return losses, round(steady[len(steady) // 2], 4)


def blocks(width, count):
    """A stack of `count` transformer-like MLP blocks (layer norm, 4x up, GELU, down, residual)
    on the GPU: the model of the `torch.compile` programs."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    return nn.Sequential(*[Block() for _ in range(count)]).cuda()
