"""Sizes as people write them (issue 28): every size-like setting takes an int of bytes or a
string with a unit ("12MiB", "8GiB", "512MB"), the same way everywhere, and a bad one is a
ConfigError naming the setting, the value and the forms accepted, where it is given; every
message writes sizes in a unit that shows them. Also: a `num_workers` that is not an int."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fastload import ConfigError, FastLoader
from fastload._daemon.control import load_config
from fastload._sizes import format_size, parse_size
from fastload.sources import FileList, Packed, TarShards, pack
from fastload.sources._storage.node_cache import default_limit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (12 << 20, 12 << 20),
        ("1073741824", 1 << 30),
        ("12MiB", 12 << 20),
        ("8GiB", 8 << 30),
        ("8 gib", 8 << 30),
        ("512MB", 512 * 10**6),
        ("512m", 512 << 20),  # as Docker's --shm-size writes it
        ("64KiB", 64 << 10),
        ("1.5GiB", 3 << 29),
        ("2TB", 2 * 10**12),
        (4e9, 4 * 10**9),  # a float that is a whole number (TOML, or 4e9 in Python)
    ],
)
def test_sizes_are_read_the_same_way_everywhere(text: object, expected: int) -> None:
    assert parse_size(text, "x") == expected


@pytest.mark.parametrize("bad", ["12 MiBs", "auto", "-1", "MiB", "", "1e9", -5, 1.5, True, None, [1]])
def test_a_bad_size_names_the_setting_the_value_and_the_forms(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(bad, "cache_limit")
    message = str(info.value)
    assert message.startswith("cache_limit must be a size") and '"12MiB"' in message and '"512MB"' in message
    assert "<" not in message  # no repr of an object


def test_a_size_under_the_minimum_says_the_minimum_in_words() -> None:
    with pytest.raises(ConfigError, match=r"index_memory must be at least 64 MiB, got \"1MiB\""):
        parse_size("1MiB", "index_memory", minimum=64 << 20)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (100, "100 B"),
        (12 << 20, "12 MiB"),  # not "0.0 GiB"
        (int(1.5 * 2**30), "1.5 GiB"),
        (640 << 10, "640 KiB"),
        (478 << 20, "478 MiB"),
        (1000 << 10, "0.977 MiB"),
        (int(12.34 * 2**20), "12.3 MiB"),
        (3 << 40, "3 TiB"),
    ],
)
def test_sizes_are_written_in_a_unit_that_shows_them(n: int, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize("make", [Packed, TarShards, FileList])
def test_every_source_cache_limit_takes_a_unit_and_is_checked_when_made(make: type) -> None:
    source = make("s3://bucket/data", cache_limit="12MiB")
    assert source.cache_limit == 12 << 20
    assert make("s3://bucket/data").cache_limit is None
    with pytest.raises(ConfigError, match=rf"cache_limit of {make.__name__} must be a size.*got \"12 MB2\""):
        make("s3://bucket/data", cache_limit="12 MB2")


def test_the_cache_limit_variable_takes_a_unit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_LIMIT", "12MiB")
    assert default_limit(str(tmp_path)) == 12 << 20
    monkeypatch.setenv("FASTLOAD_CACHE_LIMIT", "lots")
    with pytest.raises(ConfigError, match=r'FASTLOAD_CACHE_LIMIT .*must be a size.*got "lots"'):
        default_limit(str(tmp_path))


def test_daemon_sizes_from_flags_and_toml(tmp_path: Path) -> None:
    config, _ = load_config(None, {"memory_budget": "512MB"})
    assert config.memory_budget_bytes == 512 * 10**6
    toml = tmp_path / "daemon.toml"
    toml.write_text('[daemon]\nmemory_budget = "1GiB"\nindex_memory = 268435456\n')
    config, _ = load_config(str(toml), {})
    assert (config.memory_budget_bytes, config.index.memory_bytes) == (1 << 30, 256 << 20)
    with pytest.raises(ConfigError, match=r'memory_budget \(--memory-budget\) must be a size.*got "4 gigs"'):
        load_config(None, {"memory_budget": "4 gigs"})
    with pytest.raises(ConfigError, match=r"index_memory must be at least 64 MiB"):
        load_config(None, {"index_memory": "1MiB"})


@pytest.mark.parametrize(
    ("key", "value"), [("workers", '"many"'), ("max_sessions", "[4]"), ("index_idle", "true")]
)
def test_daemon_numbers_from_toml_are_named_when_bad(tmp_path: Path, key: str, value: str) -> None:
    toml = tmp_path / "daemon.toml"
    toml.write_text(f"[daemon]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=rf"daemon setting {key} must be a"):
        load_config(str(toml), {})


def test_pack_shard_size_takes_a_unit(image_folder: Path, tmp_path: Path) -> None:
    packed = pack(str(image_folder), str(tmp_path / "api"), shard_bytes="64KiB", progress=False)
    assert max(p.stat().st_size for p in Path(packed.path).glob("data-*")) <= 64 << 10
    with pytest.raises(ConfigError, match=r"shard_bytes \(--shard-size\) must be at least 4 KiB"):
        pack(str(image_folder), str(tmp_path / "small"), shard_bytes="1KiB", progress=False)
    cli = [sys.executable, "-m", "fastload", "pack", str(image_folder), str(tmp_path / "cli"), "--quiet"]
    done = subprocess.run([*cli, "--shard-size", "1X"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and 'shard_bytes (--shard-size) must be a size' in done.stderr, done.stderr


@pytest.mark.parametrize("workers", [2.0, b"2"])
def test_num_workers_not_an_int_says_what_is_accepted(image_folder: Path, workers: object) -> None:
    with pytest.raises(ConfigError, match=r"num_workers=.* is not a number of processes: pass an int"):
        FastLoader(image_folder, batch_size=4, num_workers=workers)  # type: ignore[arg-type]


def test_num_workers_a_word_other_than_auto_is_refused(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match=r"num_workers='2': pass a number, or 'auto'"):
        FastLoader(image_folder, batch_size=4, num_workers="2")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        ({"shuffle_block": object(), "shuffle": True}, "shuffle_block must be an integer >= 1, got an obj"),
        ({"num_workers": 1, "multiprocessing_context": object()}, "got an object"),
    ],
)
def test_a_bad_argument_is_named_without_a_repr(image_folder: Path, kw: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as info:
        FastLoader(image_folder, batch_size=4, **kw)  # type: ignore[arg-type]
    assert said in str(info.value) and " at 0x" not in str(info.value), str(info.value)
