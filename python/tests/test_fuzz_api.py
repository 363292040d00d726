"""Bad input never crashes the Python API: random calls of every Pool and Buffer method with
random arguments (sizes past 2**63, negative numbers, strings, NaN, buffers of the Pool, ranges
past their ends, lists) raise a tiermem error or Python's TypeError/ValueError/OverflowError —
never a Rust panic (pyo3's PanicException) or anything else — and the bytes written before are
still there. On the simulated device; seeded, so a failure repeats."""

import random

import pytest

import tiermem

CHUNK = 2 << 20
VALUES = [None, 0, -1, 1, 2**63, 2**64, -(2**63), 10**30, 1.5, float("nan"), "1GiB", "abc", "-5MiB", "",
          [], [None], (1, 2, 3), {}, b"xx", bytearray(10)]  # fmt: skip
EXPECTED = (tiermem.TiermemError, TypeError, ValueError, OverflowError)
SPARED = {"close", "free"}  # they would end the run early; each has tests of its own


def _methods(obj) -> list[str]:
    return [m for m in dir(obj) if not m.startswith("_") and m not in SPARED and callable(getattr(obj, m))]


@pytest.mark.parametrize("seed", [1, 2])
def test_random_calls_raise_only_clear_errors_and_lose_nothing(seed):
    rng = random.Random(seed)
    pool = tiermem.Pool(backend="sim", hbm_limit=32 * CHUNK, host_limit=64 * CHUNK, chunk=CHUNK)
    buffers = [pool.alloc(rng.choice([1, 4096, CHUNK, 3 * CHUNK])) for _ in range(6)]
    kept = pool.alloc(CHUNK, read_only=True)
    kept.write(b"tiermem keeps this")
    targets = [(pool, _methods(pool))] + [(b, _methods(b)) for b in buffers]
    for _ in range(3000):
        target, methods = rng.choice(targets)
        name = rng.choice(methods)
        choices = VALUES + buffers + [[rng.choice(buffers)], (rng.choice(buffers), rng.randrange(-9, 2**40), rng.randrange(-9, 2**40))]
        args = [rng.choice(choices) for _ in range(rng.randrange(4))]
        try:
            getattr(target, name)(*args)
        except EXPECTED:
            pass
        except BaseException as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{type(target).__name__}.{name}{tuple(args)!r} raised {type(e).__name__}: {e}")
        finally:
            for b in buffers:  # whatever a call acquired, so the next ones find room
                while True:
                    try:
                        pool.release([b])
                    except tiermem.TiermemError:
                        break
    pool.finish(pool.set_hbm_budget(32 * CHUNK))  # calls may have shrunk it to nothing
    assert kept.read(18) == b"tiermem keeps this"
