"""fastload from S3 against MosaicML Streaming and WebDataset from the same store (issue 23).

The store is bench_remote.py's: moto's S3 server on localhost behind the TCP proxy (a process of
its own) that adds `--latency-ms` to every request. The same images (the class folders of
--data) go to one bucket three ways, and each system reads its own copy through the proxy:

  fastload    `fastload pack [--shard-size]` of the folder at s3://BUCKET/pack; FastLoader(Packed(url,
              cache_limit=1.5x the pack)), RandomResizedCrop(224) + flip, uint8 on the CPU, a
              fresh node cache (FASTLOAD_CACHE_DIR) each round. fastload's venv (this one).
  streaming   MDS shards (streaming.MDSWriter, columns image `bytes` = the JPEG file + label
              `int`, default shard size) at s3://BUCKET/mds; StreamingDataset(remote=..., local=
              a fresh folder each round, shuffle=True, batch_size=64) with __getitem__ decoding
              by PIL, + torch DataLoader(num_workers, batch_size=64). S3 reached Streaming's way:
              S3_ENDPOINT_URL and the AWS_* variables. Its python: --streaming-python.
  webdataset  tar shards (wds.ShardWriter; as many as the MDS shards, one a worker at least) at
              s3://BUCKET/wds, read by URL: `pipe:curl -s -f http://PROXY/BUCKET/wds/shard-{000000..N}.tar`,
              the way WebDataset's docs read shards from a web server or from a bucket readable over
              HTTP(S) (a public dataset's bucket, or presigned URLs); here the bucket gets a policy
              letting anyone GET its objects. (`pipe:aws s3 cp s3://... -` would add the AWS CLI's
              ~1 s start to every shard.) wds.WebDataset(urls, shardshuffle=100 (what True means))
              .shuffle(1000).decode("pil"), the augmentation per sample, .batched(64) in the workers,
              + DataLoader(batch_size=None, num_workers). No cache (WebDataset's cache_dir is opt-in):
              its second epoch streams the shards again. Its python: --webdataset-python.

Both peers augment with torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor
arithmetic written over PIL (remote_peer_worker._pil_recipe: no torchvision wheel runs on torch
2.13.0+cpu), uint8 without normalization as fastload delivers. Batch 64, --workers workers each.

Each system runs in a fresh process (tools/bench/remote_peer_worker.py by that system's python),
two epochs: the first cold, the second from the system's cache where it has one. Within a round
the systems take turns, their order rotating from round to round. An epoch is timed from the
first iter() to the last batch, every batch checked (uint8 3x224x224, labels in range, the image
count); images/s per system per epoch, median and [min-max] over --rounds, and fastload's ratio
to each peer, per round. Also the wait for the first batch, the CPU seconds of the loader's
process tree and of the store (S3 server + proxy), fastload's cache against its limit.

    python tools/bench/bench_remote_peers.py --data FOLDER --streaming-python PY --webdataset-python PY
        [--workers 2] [--rounds 3] [--latency-ms 20] [--systems fastload,streaming,webdataset]
        [--pack-shard-mib 64]

The peer pythons (default $PEERS_STREAMING_PYTHON, $PEERS_WEBDATASET_PYTHON) are throwaway venvs
outside the repo: `pip install torch==2.13.0 mosaicml-streaming` and `pip install torch==2.13.0
webdataset` (plus curl on PATH). Needs fastload[remote] and moto[server] here (the test extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_remote import moto_server, s3_environment, start_proxy, upload  # noqa: E402
from remote_peer_worker import list_images  # noqa: E402

BUCKET = "bench-bucket"
WORKER = str(HERE / "remote_peer_worker.py")
EPOCHS = ("cold", "second")


def _make_public(endpoint: str) -> None:
    """Let an unsigned GET read the bucket (a public dataset bucket), as WebDataset's curl does."""
    import boto3

    env = s3_environment(endpoint)
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_REGION"])
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": "*",
              "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"}]}
    s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(policy))


def _prepare(args: argparse.Namespace, work: Path) -> dict[str, Path]:
    """The three copies of the images, on local disk."""
    from fastload.sources import pack

    copies = {"fastload": work / "pack", "streaming": work / "mds", "webdataset": work / "wds"}
    shard = {"shard_bytes": args.pack_shard_mib << 20} if args.pack_shard_mib else {}
    pack(args.data, str(copies["fastload"]), progress=False, **shard)
    subprocess.run([args.streaming_python, WORKER, "prepare-mds", args.data, str(copies["streaming"])],
                   check=True)
    shards = max(len(list(copies["streaming"].glob("*.mds"))), args.workers)  # one per worker at least
    subprocess.run([args.webdataset_python, WORKER, "prepare-wds", args.data, str(copies["webdataset"]),
                    "--shards", str(shards)], check=True)
    return copies


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def _describe(result: dict[str, Any]) -> str:
    epochs = "; ".join(
        f"{e['images'] / e['seconds']:,.0f} img/s ({e['seconds']:.1f} s, first batch "
        f"{e['first_batch_seconds']:.2f} s, CPU {e['cpu_seconds']:.1f} s, "
        f"store CPU {e['store_cpu_seconds']:.1f} s)"
        for e in result["epochs"]
    )
    return f"setup {result['setup_seconds']:.2f} s; {epochs}"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="an image folder")
    parser.add_argument("--streaming-python", default=os.environ.get("PEERS_STREAMING_PYTHON"))
    parser.add_argument("--webdataset-python", default=os.environ.get("PEERS_WEBDATASET_PYTHON"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--systems", default="fastload,streaming,webdataset")
    parser.add_argument("--pack-shard-mib", type=int,
                        help="the pack's largest data file (fastload's default: 1 GiB; Streaming's: 64)")
    parser.add_argument("--shuffle-block", type=int,
                        help="fastload's block shuffle run (default: a full shuffle); the peers' own "
                        "shuffles are block-wise (Streaming's py1e, WebDataset's shard order + buffer)")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if not (args.data and args.streaming_python and args.webdataset_python):
        parser.error("--data, --streaming-python and --webdataset-python (or their variables) are required")
    from fastload.sources._storage.node_cache import NodeCache

    items, classes = list_images(Path(args.data))
    work = Path(tempfile.mkdtemp(prefix="fl-bench-peers-"))
    copies = _prepare(args, work)
    sizes = {name: _size(folder) for name, folder in copies.items()}
    limit = int(sizes["fastload"] * 1.5)
    shards = sorted(p.name for p in copies["webdataset"].iterdir())
    counts = [len(list(copies[name].glob(pattern))) for name, pattern in
              (("fastload", "data-*"), ("streaming", "*.mds"), ("webdataset", "*.tar"))]
    print(f"{len(items)} images, {classes} classes; " + ", ".join(
        f"{what} {sizes[name] / 2**20:.1f} MiB in {count} files" for what, name, count in
        zip(("pack", "MDS", "tar"), copies, counts, strict=True)
    ) + f"; {args.workers} workers; +{args.latency_ms:g} ms a request", flush=True)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    cached: list[int] = []
    with moto_server() as endpoint, start_proxy(endpoint, args.latency_ms) as (proxied, proxy_pid):
        for folder in copies.values():
            upload(endpoint, BUCKET, folder, folder.name)
        _make_public(endpoint)
        import psutil

        moto_pid = next(p.pid for p in psutil.Process().children() if "moto" in " ".join(p.cmdline()))
        env = {**os.environ, **s3_environment(proxied), "S3_ENDPOINT_URL": proxied}
        base = ["--images", str(len(items)), "--classes", str(classes), "--workers", str(args.workers),
                "--epochs", str(len(EPOCHS)), "--store-pids", f"{moto_pid},{proxy_pid}"]
        last = f"{len(shards) - 1:06d}"
        command = {
            "fastload": [sys.executable, WORKER, "run", "fastload", "--url", f"s3://{BUCKET}/pack",
                         "--cache-limit", str(limit),
                         *(["--shuffle-block", str(args.shuffle_block)] if args.shuffle_block else [])],
            "streaming": [args.streaming_python, WORKER, "run", "streaming", "--url", f"s3://{BUCKET}/mds"],
            "webdataset": [args.webdataset_python, WORKER, "run", "webdataset", "--url",
                           f"pipe:curl -s -f {proxied}/{BUCKET}/wds/shard-{{000000..{last}}}.tar"],
        }
        for round_ in range(args.rounds):
            for name in systems[round_ % len(systems):] + systems[:round_ % len(systems)]:
                cache = work / f"cache-{round_}-{name}"  # cold: a fresh cache for every run
                extra = ["--local", str(cache)] if name == "streaming" else []
                own = {**env, "FASTLOAD_CACHE_DIR": str(cache)}
                done = subprocess.run(command[name] + base + extra, env=own, check=True, text=True,
                                      stdout=subprocess.PIPE, timeout=1800)
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                if name == "fastload":
                    cached.append(NodeCache(str(cache / f"remote-{os.geteuid()}"), limit).size())
                print(f"round {round_ + 1} {name:10} {_describe(results[name][-1])}", flush=True)
                shutil.rmtree(cache, ignore_errors=True)
    print(f"\n{args.data}: {len(items)} images; medians [min-max] over {args.rounds} rounds")
    for name in systems:
        for number, epoch in enumerate(EPOCHS):
            runs = [r["epochs"][number] for r in results[name]]
            busy = statistics.median(e["cpu_seconds"] / e["seconds"] for e in runs)
            store = statistics.median(e["store_cpu_seconds"] / e["seconds"] for e in runs)
            first = _median([e["first_batch_seconds"] * 1000 for e in runs])
            print(f"  {name:10} {epoch:6} {_median([e['images'] / e['seconds'] for e in runs])} img/s; "
                  f"first batch {first} ms; CPUs busy: loader {busy:.2f}, store {store:.2f}")
        print(f"  {name:10} setup  {_median([r['setup_seconds'] * 1000 for r in results[name]])} ms")
    for peer in [s for s in systems if s != "fastload" and "fastload" in systems]:
        for number, epoch in enumerate(EPOCHS):
            ratios = [theirs["epochs"][number]["seconds"] / ours["epochs"][number]["seconds"]
                      for ours, theirs in zip(results["fastload"], results[peer], strict=True)]
            print(f"  fastload / {peer:10} {epoch:6} {statistics.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}] (images/s, each round's pair)")
    if cached:
        print(f"  fastload's cache after each run: {max(cached) / 2**20:.1f} MiB at most, "
              f"limit {limit / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
