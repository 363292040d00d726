"""torch.multiprocessing sharing a CUDA tensor with a child process (CUDA IPC handles)."""
import torch
import torch.multiprocessing as mp

from common import report


def child(queue, out):
    try:
        tensor = queue.get(timeout=20)
        out.put(float(tensor.double().sum()))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails
        out.put(f"child: {type(e).__name__}: {e}")


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue, out = ctx.Queue(), ctx.Queue()
    worker = ctx.Process(target=child, args=(queue, out))
    worker.start()
    torch.manual_seed(0)
    tensor = torch.randn(16 << 20, device="cuda")  # 64 MiB
    queue.put(tensor)  # pickled on a feeder thread: a failed IPC handle shows only in the child
    try:
        total = out.get(timeout=120)
    finally:
        worker.join(timeout=10)
        if worker.is_alive():
            worker.kill()
    if isinstance(total, str):
        raise SystemExit(f"torch_multiprocessing: {total}")
    report("torch_multiprocessing", repr(total).encode(), torch.cuda.max_memory_reserved())
