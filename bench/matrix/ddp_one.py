"""A script written for torchrun, run as one process: torch.distributed over NCCL with a world
of one, the model wrapped in DistributedDataParallel (its gradient buckets all-reduced through
NCCL every step), 20 steps of an MLP of 1 GiB. NCCL makes its buffers with cuMemCreate. The
losses and the weights' bytes are digested."""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common import report, train  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
gen = torch.Generator(device="cuda").manual_seed(1)


def loss_of(_step):
    x = torch.randn(512, 4096, device="cuda", generator=gen)
    return ddp(x).square().mean()


losses, step_s = train(20, loss_of, optimizer)
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
dist.destroy_process_group()
report("ddp_one", repr(losses).encode() + weights.numpy().tobytes(), torch.cuda.max_memory_reserved(), step_s=step_s)
