"""A pack read from object storage against the same pack on local disk (issue 23).

The store: moto's S3-compatible server on localhost (started here), behind a TCP proxy (a process
of its own) that adds `--latency-ms` to every request (20 ms: a store in another building); a
cold node cache each round. For each round, in turn: two epochs of the local pack, then two of
the same pack at `s3://` (the first cold, the second from the cache), each pair one FastLoader
with `--workers` workers, RandomResizedCrop(224) + flip, batch 64, device="cpu". Images/s per
epoch; medians and [min-max] over rounds, each epoch against the local pack's same epoch; the
cache's size against its limit after each round.

    python tools/bench/bench_remote.py --data FOLDER [--workers 2] [--rounds 3] [--latency-ms 20]
        [--shard-mib 64] [--shuffle-block N]
    python tools/bench/bench_remote.py --store-only     # the store's bandwidth, no loader

Needs fastload[remote] and moto[server] (the test extra has both).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from remote_helpers import FaultProxy, moto_server, s3_environment, upload


def _serve_proxy(upstream: tuple[str, int], latency_s: float, ready: Any) -> None:
    """The proxy in a process of its own: its byte copying must not take the trainer's CPU."""
    proxy = FaultProxy(upstream, latency_s=latency_s)
    ready.send(proxy.port)
    threading.Event().wait()


@contextlib.contextmanager
def start_proxy(endpoint: str, latency_ms: float) -> Iterator[tuple[str, int]]:
    """The latency proxy in front of `endpoint` (moto's server), in its own process: (its URL, its pid)."""
    mine, theirs = multiprocessing.Pipe()
    upstream = ("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
    proxy = multiprocessing.get_context("fork").Process(
        target=_serve_proxy, args=(upstream, latency_ms / 1000, theirs), daemon=True
    )
    proxy.start()
    try:
        yield f"http://127.0.0.1:{mine.recv()}", proxy.pid
    finally:
        proxy.kill()
        proxy.join()


def _cpu_seconds(processes: list[Any]) -> float:
    """User + system CPU seconds these processes (psutil) have used so far."""
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def _two_epochs(
    path: str, workers: int, cache_limit: int, store: list[Any], block: int | None
) -> tuple[float, float, float]:
    """Images/s of a loader's first and second epochs (for a URL: cold, then from the cache), and
    the share of the machine's CPU the `store` processes (the S3 server, the proxy) took in the
    first: on this benchmark's one machine they compete with the loader's workers, as a real
    store on other machines would not."""
    from fastload import FastLoader
    from fastload import transforms as T
    from fastload.sources import Packed

    recipe = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    source = Packed(path, cache_limit=cache_limit)
    rates = []
    with FastLoader(source, batch_size=64, num_workers=workers, transform=recipe, device="cpu", shuffle=True,
                    shuffle_block=block, seed=0) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            started, images, store_cpu = time.perf_counter(), 0, _cpu_seconds(store)
            for _, labels in loader:
                images += len(labels)
            elapsed = time.perf_counter() - started
            rates.append(images / elapsed)
            if epoch == 0:
                store_share = (_cpu_seconds(store) - store_cpu) / (elapsed * len(os.sched_getaffinity(0)))
    return rates[0], rates[1], store_share


def _store_bandwidth(latency_ms: float) -> None:
    """MiB/s the store and the proxy give alone (no decoders beside them)."""
    from concurrent.futures import ThreadPoolExecutor

    from fastload.sources._storage import remote as _remote

    objects = Path(tempfile.mkdtemp(prefix="fl-bench-store-"))
    for k in range(6):
        (objects / f"object-{k}").write_bytes(os.urandom(64 << 20))
    reads = [(f"s3://bench-bucket/probe/object-{k}", c << 23) for k in range(6) for c in range(8)]
    with moto_server() as endpoint, start_proxy(endpoint, latency_ms) as (proxied, _):
        upload(endpoint, "bench-bucket", objects, "probe")
        os.environ.update(s3_environment(proxied))
        for in_flight in (4, 16):
            with ThreadPoolExecutor(in_flight) as pool:
                started = time.perf_counter()
                list(pool.map(lambda r: _remote.read_range(r[0], r[1], r[1] + (8 << 20)), reads))
                elapsed = time.perf_counter() - started
            print(f"{in_flight:2} ranged reads of 8 MiB in flight: {len(reads) * 8 / elapsed:.0f} MiB/s")


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="an image folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument(
        "--shuffle-block", type=int, default=None,
        help="a block shuffle's run length (default: a full shuffle); the same for both copies",
    )
    parser.add_argument(
        "--shard-mib", type=int, default=1024,
        help="the pack's data files, MiB (pack's default 1024; moto copies the whole object for each "
        "ranged GET, a real store does not: smaller files show the loader rather than moto)",
    )
    parser.add_argument(
        "--store-only", action="store_true",
        help="no loader: the store's own bandwidth through the proxy, 4 and 16 ranged reads of 8 MiB "
        "in flight over six 64 MiB objects",
    )
    args = parser.parse_args()
    if args.store_only:
        _store_bandwidth(args.latency_ms)
        return
    if not args.data:
        parser.error("--data (or $BENCH_DATA) is required")
    from fastload.sources import pack
    from fastload.sources._storage.node_cache import NodeCache

    work = Path(tempfile.mkdtemp(prefix="fl-bench-remote-"))
    pack(args.data, str(work / "pack"), progress=False, shard_bytes=args.shard_mib << 20)
    data_bytes = sum(p.stat().st_size for p in (work / "pack").iterdir())
    limit = int(data_bytes * 1.5)
    import psutil

    rates: dict[str, list[float]] = {"local 1st": [], "local 2nd": [], "s3 cold": [], "s3 warm": []}
    shares: list[float] = []
    with moto_server() as endpoint, start_proxy(endpoint, args.latency_ms) as (proxied, proxy_pid):
        upload(endpoint, "bench-bucket", work / "pack", "pack")
        os.environ.update(s3_environment(proxied))
        store = [
            p for p in psutil.Process().children() if p.pid == proxy_pid or "moto" in " ".join(p.cmdline())
        ]
        for round_ in range(args.rounds):
            os.environ["FASTLOAD_CACHE_DIR"] = str(work / f"cache-{round_}")  # cold
            both_ways = (args.workers, limit, store, args.shuffle_block)
            first, second, _ = _two_epochs(str(work / "pack"), *both_ways)
            rates["local 1st"].append(first)
            rates["local 2nd"].append(second)
            cold, warm, share = _two_epochs("s3://bench-bucket/pack", *both_ways)
            shares.append(share)
            rates["s3 cold"].append(cold)
            rates["s3 warm"].append(warm)
            cached = NodeCache(str(work / f"cache-{round_}" / f"remote-{os.geteuid()}"), limit).size()
            both = f"local {first:.0f} then {second:.0f}, s3 cold {cold:.0f} then warm {warm:.0f} img/s"
            print(f"round {round_ + 1}: {both}; the store took {share:.0%} of the CPUs in the cold "
                  f"epoch; cache {cached / 2**20:.1f} MiB of {limit / 2**20:.1f} MiB allowed", flush=True)
    latency = f"+{args.latency_ms:g} ms a request"
    print(f"{args.data}: {data_bytes / 2**20:.1f} MiB packed; {args.workers} workers; {latency}")
    for name, values in rates.items():
        same = rates["local 2nd" if name in ("local 2nd", "s3 warm") else "local 1st"]
        share = statistics.median(v / loc for v, loc in zip(values, same, strict=True))
        print(f"  {name:8} {statistics.median(values):7.0f} img/s [{min(values):.0f}-{max(values):.0f}]  "
              f"{share:.0%} of local's same epoch (median of per-round ratios)")
    print(f"  the S3 server and proxy took {statistics.median(shares):.0%} of this machine's CPUs in the "
          f"cold epochs [{min(shares):.0%}-{max(shares):.0%}]")


if __name__ == "__main__":
    main()
