"""Where the slow rounds of `bench tenants` went: for each job of a scenario in a detail JSON
(`tenants-*.detail.json`, since the thirty-first session's round columns), every round slower
than the job's median by FACTOR, with what changed during it — the budget, bytes paged in, the
milliseconds its acquires waited for page-ins and evictions, the driver's milliseconds mapping,
unmapping and pinning, and the pinned host memory.

Usage: python3 scripts/gpu/probes/slow_rounds.py DETAIL.json [SCENARIO ...] [--factor 1.2]
(scenarios: static, tiermemd, working_sets, serial, victims_with_hog, ...; default static and
tiermemd)."""

import argparse
import json
import statistics

GIB = 1 << 30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("detail")
    parser.add_argument("scenarios", nargs="*", default=["static", "tiermemd"])
    parser.add_argument("--factor", type=float, default=1.2, help="a round this many times the median is slow")
    args = parser.parse_args()
    detail = json.load(open(args.detail))
    columns = detail.get("rounds_columns")
    if not columns:
        raise SystemExit(f"{args.detail}: no rounds_columns (written before the thirty-first session)")
    at = {name: i for i, name in enumerate(columns)}
    for scenario in args.scenarios:
        seen = {}
        for outcome in detail.get(scenario, []):
            repeat = outcome.get("repeat", 0)  # the throughput sets run --repeats times
            job = seen[repeat] = seen.get(repeat, -1) + 1
            rounds = outcome["rounds"]
            ends = [r[at["s"]] for r in rounds]
            times = [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
            median = statistics.median(times)
            print(f"{scenario} repeat {repeat} job {job}: {len(rounds)} rounds, median {median * 1e3:.0f} ms, "
                  f"{outcome['seconds']:.2f} s in all")
            for i, took in enumerate(times):
                if took < args.factor * median:
                    continue
                now, before = rounds[i], rounds[i - 1] if i else [0] * len(columns)
                delta = {name: now[k] - before[k] for name, k in at.items()}
                print(f"  round {i:3d} ending at {now[at['s']]:6.2f} s: {took * 1e3:5.0f} ms;"
                      f" budget {now[at['hbm_budget']] / GIB:.2f} GiB, paged in {delta['paged_in'] / GIB:.2f} GiB,"
                      f" waits: page-ins {delta['stall_ms']:.0f} ms, evictions {delta['evict_wait_ms']:.0f} ms;"
                      f" driver: map {delta['map_ms']:.0f} ms, unmap {delta['unmap_ms']:.0f} ms,"
                      f" pin {delta['pin_ms']:.0f} ms; pinned {now[at['host_pinned']] / GIB:.2f} GiB")


if __name__ == "__main__":
    main()
