"""The `fastload` command line; each subcommand imports what it needs only when it runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


def _workers_arg(value: str) -> int | str:
    """`fastload serve --workers`: a number of processes, or "auto" (sized by the sessions' need)."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of processes or 'auto', got {value!r}") from None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastload", description="Fast data loading for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="load a small built-in JPEG dataset and compare with torch DataLoader")
    demo.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: make a demo dataset)")
    demo.add_argument(
        "--epochs", type=int, default=3, help="epochs timed, after a warm-up one; the figure is their median"
    )
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--batch-size", type=int, default=32)
    demo.add_argument("--images", type=int, default=1536, help="size of the generated dataset")
    demo.add_argument("--no-baseline", action="store_true", help="skip the torch DataLoader run")

    serve = sub.add_parser("serve", help="run the loader daemon in the foreground (SIGTERM drains and exits)")
    serve.add_argument("--config", help="a TOML file with a [daemon] table")
    serve.add_argument(
        "--workers", type=_workers_arg,
        help="decode worker processes (default: all CPUs), or 'auto': sized by the sessions' need",
    )
    serve.add_argument("--memory-budget", help="shared memory for all sessions' rings, e.g. 8GiB")
    serve.add_argument("--listen", help="also listen on tcp://HOST:PORT (needs CURVE keys in --config)")
    serve.add_argument(
        "--socket-dir", help="directory of the local socket (default: $XDG_RUNTIME_DIR/fastload)"
    )
    serve.add_argument("--dataset", action="append", dest="datasets", help="a folder to index at start")
    serve.add_argument(
        "--root",
        action="append",
        dest="roots",
        help="serve only files under this directory, links followed, or objects under this URL prefix "
        "(s3://bucket/prefix/); repeatable; required with --listen",
    )
    serve.add_argument(
        "--ipc-any-path",
        action="store_const",
        const=True,
        help="with --root: local (same-user) sessions may still name any path; TCP ones never",
    )
    serve.add_argument(
        "--hang-timeout", type=float, help="seconds a batch may run before its worker is replaced (0: off)"
    )
    serve.add_argument(
        "--metrics",
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (a PORT alone: 127.0.0.1; "
        "0.0.0.0:PORT to be scraped from other machines); needs fastload[metrics]",
    )
    serve.add_argument(
        "--log-format", choices=("text", "json"), help="json: one JSON object a line, events as keys"
    )
    serve.add_argument(
        "--plugin",
        action="append",
        dest="plugins",
        metavar="MODULE_OR_FILE.py",
        help="a module (mylab.kinds) or Python file the daemon imports at start, before its workers "
        "fork, so that the source kinds and transforms it declares can be served; repeatable, "
        "replaces the config's `plugins`; the administrator's setting: a trainer never names one",
    )

    for name, text in (
        ("status", "show the daemon's sessions; exit 1 when none answers or it is draining (a health check)"),
        ("stop", "ask the daemon to finish the batches in flight and exit"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("--address", help="daemon address (default: this user's local socket)")
        if name == "status":
            cmd.add_argument(
                "--json", action="store_true", help="one JSON object: healthy, reason, and every figure"
            )
    sub.add_parser("keys", help="print a new CURVE key pair for a TCP daemon or client")

    pack = sub.add_parser(
        "pack", help="copy a dataset's encoded images into large aligned files with an index (resumable)"
    )
    pack.add_argument(
        "src",
        help="a source of encoded images: a folder, a file list (.csv/.tsv/.txt), tar shards (a path, glob "
        "or {000..099} pattern), an HDF5 file of encoded images (.h5/.hdf5), or a pack; a local path or "
        "a URL (s3://, gs://, https://)",
    )
    pack.add_argument("dst", help="the pack's directory (new or empty; or a pack of SRC to finish)")
    pack.add_argument("--shard-size", default="1GiB", help="largest data file, e.g. 1GiB (default), 512MiB")
    pack.add_argument("--quiet", action="store_true", help="no progress on stderr")
    pack.add_argument(
        "--shuffle", type=int, metavar="SEED", help="store the samples in an order shuffled from SEED"
    )
    pack.add_argument(
        "--max-side",
        type=int,
        metavar="N",
        help="re-encode images whose longer side exceeds N, resized to N (aspect kept, antialiased), as "
        "JPEG; smaller ones are stored as they are (FFCV's max_resolution). Less to decode per image: "
        "docs/BENCHMARKS.md",
    )
    pack.add_argument(
        "--quality",
        type=int,
        metavar="Q",
        help="JPEG quality of re-encoded images, 1..100 (default 90, FFCV's: on photos about 0.7x the bytes "
        "of 95 and 0.45x those of 100, so less to read and decode, past the point where JPEG's loss shows)",
    )
    pack.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="processes that re-encode, with --max-side (default: all CPUs); the pack is the same for any N",
    )
    pack.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=False,
        metavar="ADDRESS",
        help="read and re-encode the samples in Ray tasks over a cluster (pip install 'fastload[ray]'): "
        "at ADDRESS (ray://HOST:10001, HOST:6379, auto), else RAY_ADDRESS's, else a local Ray of --workers "
        "CPUs; the same bytes as without. Every node reads SRC at its own path (shared storage). Put "
        "it after SRC DST, or write --ray=ADDRESS",
    )
    pack.add_argument(
        "--exclude",
        metavar="LIST",
        help="leave out the samples this list names (what `fastload verify SRC -o LIST` writes); the "
        "manifest records them",
    )
    pack.add_argument(
        "--on-error",
        choices=("raise", "skip"),
        default="raise",
        help="a sample that cannot be read or is not a whole image (empty, cut short, not an image): "
        "raise (default: stop, naming it; the samples packed so far are kept, and the same command "
        "goes on from them) or skip (leave it out, list it in the manifest, and say so at the end)",
    )
    pack.add_argument(
        "--root", help="with a file list: the folder its paths are relative to (default: the list's folder)"
    )
    pack.add_argument(
        "--delimiter",
        metavar="SEP",
        help="with a file list: its separator, one character or tab/space (default: by suffix, sniffed)",
    )
    pack.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        help="with a file list: its first line is (--header) or is not (--no-header) column names "
        "(default: skipped when clearly so)",
    )

    verify = sub.add_parser(
        "verify", help="decode every sample of a source once, in parallel, and list the broken ones"
    )
    verify.add_argument("path", help="a source: a folder, a file list, tar shards, a pack, an HDF5 file")
    verify.add_argument(
        "-o", "--output", metavar="LIST", help="write the broken samples here, for FastLoader(exclude=LIST) "
        "(default: print them)"
    )
    verify.add_argument("--workers", type=int, metavar="N", help="worker processes (default: the loader's)")
    verify.add_argument("--quiet", action="store_true", help="no progress line on stderr")

    iostat = sub.add_parser("iostat", help="where each running loader's time goes, with a verdict and advice")
    iostat.add_argument(
        "interval", nargs="?", type=float, help="seconds between reports (default: one report)"
    )
    iostat.add_argument("count", nargs="?", type=int, help="number of reports (default: until Ctrl-C)")
    iostat.add_argument("-x", action="store_true", dest="extended", help="per-stage ms per sample")
    iostat.add_argument("--json", action="store_true", help="one JSON object per report")
    iostat.add_argument("--plot", metavar="FILE.png", help="draw throughput and stage times over the run")
    iostat.add_argument(
        "--probe", metavar="PATH", help="storage and decode speed of a dataset (any source), no training"
    )
    iostat.add_argument("--workers", type=int, help="with --probe: workers you plan to use")
    iostat.add_argument("--target", type=float, help="with --probe: images/s you need")
    iostat.add_argument(
        "--transform",
        metavar="JSON",
        help="with --probe: the chain to time, as fastload.transforms.to_config "
        'writes it, e.g. \'[{"type": "RandomResizedCrop", "size": 224}, {"type": "RandAugment"}]\' '
        "(default: RandomResizedCrop(224) + flip)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _build_parser().parse_args(argv)
    from fastload._errors import ConfigError, FastloadError

    try:
        if args.command == "demo":
            from fastload._demo import run_demo

            run_demo(args.data, args.epochs, args.workers, args.batch_size, args.images, not args.no_baseline)
            return 0
        from fastload._daemon import control as _control

        if args.command == "pack":
            from fastload._cli_sources import pack_source
            from fastload.sources import pack

            pack(
                pack_source(args.src, args.root, args.delimiter, args.header),
                args.dst,
                shard_bytes=args.shard_size,
                progress=not args.quiet,
                shuffle_seed=args.shuffle,
                max_side=args.max_side,
                quality=args.quality,
                workers=args.workers,
                ray=args.ray,
                exclude=args.exclude,
                on_error=args.on_error,
            )
            return 0

        if args.command == "serve":
            overrides = {
                "workers": args.workers,
                "memory_budget": args.memory_budget,
                "listen": args.listen,
                "socket_dir": args.socket_dir,
                "datasets": args.datasets,
                "hang_timeout": args.hang_timeout,
                "roots": args.roots,
                "ipc_any_path": args.ipc_any_path,
                "metrics": args.metrics,
                "log_format": args.log_format,
                "plugins": args.plugins,
            }
            return _control.serve(args.config, overrides)
        if args.command == "status":
            return _control.status(args.address, as_json=args.json)
        if args.command == "stop":
            return _control.stop(args.address)
        if args.command == "keys":
            return _control.keys()
        if args.command == "verify":
            from fastload._diagnostics.verify import run as run_verify

            return run_verify(args.path, args.output, args.workers, args.quiet)
        if args.command == "iostat":
            if args.probe:
                from fastload._diagnostics.probe import format_probe, probe, probe_to_json

                chain = None
                if args.transform is not None:
                    from fastload.transforms import from_config

                    try:
                        chain = from_config(json.loads(args.transform))
                    except ValueError as e:
                        raise ConfigError(f"--transform is not JSON: {e}") from None
                result = probe(args.probe, workers=args.workers, target=args.target, transform=chain)
                print(json.dumps(probe_to_json(result)) if args.json else format_probe(result))
                return 0
            from fastload._diagnostics.iostat import run

            if args.interval is not None and args.interval <= 0:
                raise ConfigError("the interval must be positive")
            return run(args.interval, args.count, args.extended, args.json, args.plot)
    except FastloadError as e:
        print(f"fastload: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
