"""iostat's verdict: which stage bounds a loader, from its rates and the machine's, and its advice.

`classify` names one of storage-bound, decode-bound, augment-bound, transport-bound,
host-to-device-bound, epoch-start-bound, not the bottleneck or idle (`metrics.VERDICTS`), with the
advice lines that say what to change; the thresholds it judges by are named here. What a tuner
moves (`r.tuner`: the worker count, the batches in flight) is never advice to set by hand: the
advice says what the tuner holds it at, and why.
"""

from __future__ import annotations

from fastload._diagnostics.loader_rates import LoaderRates, MachineRates, TunerState
from fastload._loading.order import read_ahead

# The trainer waiting less than this share of the time means the loader keeps up.
WAIT_BOUND_PERCENT = 10.0
BUSY_BOUND_PERCENT = 80.0
H2D_BOUND_PERCENT = 60.0
DISK_BOUND_UTIL = 80.0
IOWAIT_BOUND_PERCENT = 20.0
# Reads on a CPU or queued for one less than this share of their time are waiting on I/O
# (NOTE [storage wait or CPU wait] in `classify`).
READ_WAITING = 0.3
CPU_CONTENDED = 0.3  # reads queued for a CPU this share of their time: the cores are oversubscribed
REMOTE_WAITING = 0.5  # reads waiting for object storage this share of their time: storage-bound
EPOCH_START_SHARE = 0.3  # the trainer's wait is mostly at epoch starts: the pipeline drains there


def classify(r: LoaderRates, m: MachineRates, cores: int) -> tuple[str, list[str]]:
    """The loader's verdict and advice lines, from its rates and the machine's."""
    advice: list[str] = []
    if r.batch_size % 8 and r.device == "cuda":  # a GPU's matter: no advice for CPU batches
        advice.append(f"batch size {r.batch_size} is not a multiple of 8: tensor cores prefer multiples of 8")
    if r.samples_per_s == 0 and r.trainer_wait_percent < WAIT_BOUND_PERCENT:
        return "idle", advice
    if r.trainer_wait_percent < WAIT_BOUND_PERCENT:
        return "not the bottleneck", [
            f"the trainer waits only {r.trainer_wait_percent:.0f}% of the time in next(): the model "
            "step is slower than loading, so speed that up (AMP, channels_last, a larger batch); "
            "the loader has headroom",
            *advice,
        ]
    if r.epochs and r.epoch_start_wait_percent > EPOCH_START_SHARE * r.trainer_wait_percent:
        # A loader decodes its next epoch's first batches while the trainer eats this epoch's tail
        # (NOTE [no drain]), locally and with a daemon; these are the cases it cannot.
        advice.append(
            f"{r.epoch_start_wait_percent:.0f}% of the time goes to waiting for the first batch of "
            f"{r.epochs} epoch(s): those epochs started cold. A loader decodes the next epoch ahead "
            "only when it outlives the epoch (one loader per phase, made once, not per epoch), the "
            "epoch it runs next is the one after (set_epoch skips none), its order is fastload's "
            "own (not a sampler= or batch_sampler= of yours) and persistent_workers is not False"
        )
        if r.trainer_wait_percent - r.epoch_start_wait_percent < WAIT_BOUND_PERCENT:
            return "epoch-start-bound", advice  # between epoch starts the trainer hardly waits
    ms = r.ms_per_sample
    h2d_busy = ms["h2d"] * r.samples_per_s / 10.0  # percent of wall time spent copying
    if r.device == "cuda" and h2d_busy > H2D_BOUND_PERCENT:
        return "host-to-device-bound", [
            f"copies to the GPU take {h2d_busy:.0f}% of the time: ship uint8 and normalize on the GPU "
            "(normalize=..., dtype=torch.float16), and check the PCIe link width (nvidia-smi -q)",
            *advice,
        ]
    work = ms["read"] + ms["decode"] + ms["augment"]
    read_share = ms["read"] / work if work else 0.0
    # NOTE [storage wait or CPU wait]: a reading thread's wall time is time on a CPU (read_cpu)
    # + time runnable but waiting for a CPU (read_runq: the kernel's run-queue delay) + time
    # blocked (storage, sleeps, locks). Only the blocked part is waiting for storage. On an
    # oversubscribed machine (more runnable tasks than cores: other jobs, or more workers than
    # cores) a reader that only computes, such as a Dataset decoding in __getitem__, spends most
    # of its wall time in the run queue: judged by CPU / wall alone, 2 such workers beside 4 busy
    # processes on 2 cores read at 29% CPU and were called storage-bound. So reads wait on I/O
    # when they are neither on a CPU nor queued for one most of the time. Where the kernel does
    # not report run-queue delay, read_runq is 0 and this is CPU / wall, as before.
    runnable_share = (ms["read_cpu"] + ms["read_runq"]) / ms["read"] if ms["read"] else 1.0
    runq_share = ms["read_runq"] / ms["read"] if ms["read"] else 0.0
    if read_share > 0.5 and ms["net_wait"] > REMOTE_WAITING * ms["read"]:
        return "storage-bound", [_remote_advice(r), *advice]
    disk_busy = m.disk is not None and m.disk.get("util_percent", 0.0) > DISK_BOUND_UTIL
    waiting_on_reads = read_share > 0.5 and runnable_share < READ_WAITING
    if waiting_on_reads or disk_busy or m.cpu.get("iowait", 0.0) > IOWAIT_BOUND_PERCENT:
        where = m.device
        if m.device_kind == "network":
            tip = "copy the data to local NVMe or pack it into shards (large sequential reads)"
        elif m.device_kind == "hdd":
            tip = "move the data to an SSD/NVMe, or pack it into shards so reads are sequential"
        elif disk_busy:
            tip = "the disk is saturated: a faster disk, or data that fits the page cache"
        elif r.tuner is not None and r.tuner.tunes_workers:
            tip = _tuner_holds_workers(r.tuner)
        else:
            tip = f"more workers keep more reads in flight (now {r.workers})"
        return "storage-bound", [
            f"storage-bound on {where}: {ms['read']:.2f} ms/sample reading vs "
            f"{ms['decode']:.2f} decoding; {tip}",
            *advice,
        ]
    if r.worker_busy_percent > BUSY_BOUND_PERCENT and ms["augment"] > ms["decode"]:
        gpu = (
            "they run in the workers because batches stay on the CPU: with device='cuda' they run "
            "batched on the GPU after the copy"
            if r.device == "cpu"
            else "fewer or cheaper ones (a hue shift costs the most)" + (
                f"; {_tuner_holds_workers(r.tuner)}"
                if r.tuner is not None and r.tuner.tunes_workers
                else ", or more workers"
            )
        )
        return "augment-bound", [
            f"augment-bound: the pixel transforms (colour, policies) take {ms['augment']:.2f} ms/sample "
            f"against {ms['decode']:.2f} decoding, with {r.workers} workers {r.worker_busy_percent:.0f}% "
            f"busy; {gpu}",
            *advice,
        ]
    if r.worker_busy_percent > BUSY_BOUND_PERCENT:
        if runq_share > CPU_CONTENDED:
            tip = (
                f"they wait for a free core {100 * runq_share:.0f}% of the time they read: the cores "
                "are oversubscribed (other processes, or more workers than cores), so more workers "
                "will not help; give the loader cores of its own, or add cores"
            )
        elif r.workers < cores and r.tuner is not None and r.tuner.tunes_workers:
            tip = _tuner_holds_workers(r.tuner)
        elif r.workers < cores:
            tip = f"{cores - r.workers} core(s) are free: raise num_workers to {cores}"
        elif r.device == "cuda":
            tip = (
                "add cores, store smaller images (fastload pack --max-side 320), or decode on the "
                "GPU (backend='dali')"
            )
        else:
            tip = "add cores, or store smaller images (fastload pack --max-side 320)"
        return "decode-bound", [
            f"decode-bound: {r.workers} workers on {cores} cores are "
            f"{r.worker_busy_percent:.0f}% busy; {tip}",
            *advice,
        ]
    window = r.tuner if r.tuner is not None and r.tuner.tunes_in_flight else None
    if ms["slot_wait"] > 0.5 * work:
        return "transport-bound", [
            "every slot is held while workers could work: release batches sooner (don't keep references)"
            + (f"; {_tuner_holds_window(window)}" if window else ", or raise prefetch"),
            *advice,
        ]
    wait = (
        f"the trainer waits {r.trainer_wait_percent:.0f}% of the time while workers are only "
        f"{r.worker_busy_percent:.0f}% busy"
    )
    if window is not None:
        return "transport-bound", [f"{wait}; {_tuner_holds_window(window)}", *advice]
    return "transport-bound", [
        f"{wait}: raise prefetch (now {r.in_flight + r.ready_batches} batches ahead)",
        *advice,
    ]


def _last_change(t: TunerState) -> str:
    return f"its last change: {t.reason_words}" if t.changes else "no change made yet"


def _tuner_holds_workers(t: TunerState) -> str:
    """Why a tuned loader runs the workers it does, instead of advice to set num_workers."""
    return (
        f"the tuner holds num_workers at {t.workers} ({_last_change(t)}); it adds one only while the "
        "trainer waits, the workers are busy and a core is idle (counting the trainer's own threads "
        "and other processes), and keeps it only if it buys batches"
    )


def _tuner_holds_window(t: TunerState) -> str:
    """Why a tuned loader keeps the batches in flight it does, instead of advice to set prefetch."""
    return (
        f"the tuner holds the batches in flight at {t.in_flight} ({_last_change(t)}); it adds more "
        "while the trainer waits and the workers idle between tasks, within what /dev/shm allows"
    )


def _remote_advice(r: LoaderRates) -> str:
    """Why reads of object storage hold the loader back, and what to change."""
    ms = r.ms_per_sample
    hit = r.cache_hit_percent
    said = (
        f"storage-bound on object storage: {ms['net_wait']:.2f} of {ms['read']:.2f} ms/sample reading "
        f"waits for chunks not in the node cache ({r.net_mb_per_s:.1f} MB/s fetched"
        f"{f', {hit:.0f}% of chunk reads from the cache' if hit is not None else ''})"
    )
    if hit is not None and hit < 50.0 and r.epochs_so_far > 1:  # past the first epoch: the cache's to answer
        return (
            f"{said}; later epochs fetch again: the node cache is smaller than the data, so raise "
            "cache_limit (or FASTLOAD_CACHE_LIMIT), or put the cache (FASTLOAD_CACHE_DIR) on a larger disk"
        )
    return (
        f"{said}; keep more requests in flight (FASTLOAD_REMOTE_REQUESTS, {read_ahead.DEFAULT_REQUESTS} by "
        "default), use a block shuffle (shuffle_block=) so that a window of batches shares chunks, or "
        "pack the data "
        "(`fastload pack SRC s3://...`: packs are read by byte ranges, tar shards whole)"
    )
