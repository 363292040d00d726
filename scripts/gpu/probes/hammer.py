"""A program that keeps GPU 0 busy: GIB tensors of 1 GiB (default 8), each multiplied by one and
incremented in place, a synchronization per round, for SECONDS; prints "ready" once its memory
is allocated and, at the end, the rounds and whether every tensor holds what the rounds made
it (exit 1 if not). The newcomer of daemon_transparent.sh, the neighbour of followup41c.sh and
contended_remap.py. Usage: python3 hammer.py SECONDS [GIB] [LABEL]"""
import sys
import time

import torch

seconds = float(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 8
label = sys.argv[3] if len(sys.argv) > 3 else "hammer"
t = [torch.full((256 << 20,), float(i), device="cuda") for i in range(count)]
print("ready", flush=True)
end = time.time() + seconds
rounds = 0
while time.time() < end:
    for x in t:
        x.mul_(1.0).add_(1.0)
    torch.cuda.synchronize()
    rounds += 1
sums = [float(x[:1024].double().sum()) for x in t]
ok = all(abs(s - 1024 * (i + rounds)) < 1e-3 for i, s in enumerate(sums))
print(f"{label}: {rounds} rounds over {count} GiB, values {'right' if ok else 'WRONG'}", flush=True)
sys.exit(0 if ok else 1)
