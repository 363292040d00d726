"""A program using two GPUs in one process, as a model split across GPUs does (accelerate's
device_map): tensors copied from GPU 0 to GPU 1 and back, small (the driver's, under tiermem)
and large (tiermem's: VMM chunks opened to their own GPU), each checked against the original.
Run plainly and under `tiermem run`; one JSON line on stdout."""
import json
import sys

import torch


def main():
    out = {"gpus": torch.cuda.device_count(), "peer_0_1": torch.cuda.can_device_access_peer(0, 1)}
    # The last is larger than a 1 GiB budget: part of each copy's source and destination is on
    # the host, opened to both GPUs.
    for name, n in [("small_1MiB", 1 << 18), ("large_256MiB", 1 << 26), ("over_budget_1536MiB", 3 << 27)]:
        try:
            torch.manual_seed(0)
            a = torch.randn(n, device="cuda:0")
            b = a.to("cuda:1")
            c = (b * 2).to("cuda:0")
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            out[name] = bool(torch.equal(b.cpu(), a.cpu()) and torch.equal(c, a * 2))
        except Exception as e:  # noqa: BLE001 - recorded: the point is to see what fails
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    print(json.dumps(out))
    return 0 if all(v is True for k, v in out.items() if k.startswith(("small", "large", "over"))) else 1


if __name__ == "__main__":
    sys.exit(main())
