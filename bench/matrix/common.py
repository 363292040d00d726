"""Shared by the coverage matrix's programs (bench/transparent_matrix.py): each prints one JSON
line with the digest of what it computed (bitwise: a sha256 of the result's bytes) and the most
GPU memory it held, and nothing else on stdout."""
import hashlib
import json


def report(name, result_bytes, peak_bytes, **extra):
    print(json.dumps({"program": name, "digest": hashlib.sha256(result_bytes).hexdigest(), "peak_bytes": int(peak_bytes), **extra}), flush=True)
