"""A training loop fed by a DataLoader with worker processes (forked, as PyTorch does on Linux
by default, after CUDA is initialised in the parent) and pinned batches copied to the GPU
without blocking: an MLP of 1 GiB of weights trained for 30 steps on batches each worker
makes from its index. The losses and the weights' bytes are digested."""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS

import torch  # noqa: E402

from common import report, train  # noqa: E402


class Batches(torch.utils.data.Dataset):
    """Batch `i`: inputs and targets made from `i` alone, so any worker makes the same one."""

    def __len__(self):
        return 30

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, 4096, generator=g), torch.randn(512, 4096, generator=g)


torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)]).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
torch.cuda.synchronize()  # CUDA is initialised in the parent before the workers fork
loader = torch.utils.data.DataLoader(Batches(), batch_size=None, num_workers=2, pin_memory=True)
batches = iter(loader)


def loss_of(_step):
    x, y = next(batches)
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    return torch.nn.functional.mse_loss(model(x), y)


losses, step_s = train(len(Batches()), loss_of, optimizer)
weights = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
report("dataloader", repr(losses).encode() + weights.numpy().tobytes(), torch.cuda.max_memory_reserved(), step_s=step_s)
