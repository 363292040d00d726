"""torch.multiprocessing sharing a CUDA tensor with a child process (CUDA IPC handles)."""
import torch
import torch.multiprocessing as mp

from common import report


def child(queue, out):
    tensor = queue.get()
    out.put(float(tensor.double().sum()))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue, out = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=child, args=(queue, out))
    worker.start()
    torch.manual_seed(0)
    tensor = torch.randn(16 << 20, device="cuda")  # 64 MiB
    queue.put(tensor)
    total = out.get(timeout=120)
    worker.join()
    report("torch_multiprocessing", repr(total).encode(), torch.cuda.max_memory_reserved())
