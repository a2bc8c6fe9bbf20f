"""The format decision: which format and how many DataLoader workers deliver a target rate, from measured rows.

Pure arithmetic over the rows of one `host_benchmark.py --compare` run (or its saved `--json`);
nothing is measured here. For each format, its loader row with device normalisation (`<format>/device`,
else `<format>/host`) gives:

    cores needed per instance   = R / images per CPU-second   (the per-core rate of all its processes)
    --dataloader-worker         = ceil(cores needed), at least 1 (one worker per core; the main
                                  process's CPU is inside the per-CPU-second figure)
    storage MB/s per host       = N x R x stored bytes per image
    split bytes                 = images x stored bytes per image, against the page cache (the memory
                                  the host had available): a local split that fits is read from memory
                                  after the first epoch; one that does not, or a remote one, is read from
                                  the store every epoch, at most at its measured transport ceiling
    rate per instance           = min(C x images per CPU-second, ceiling / bytes per image / N)

and the resource that sets that minimum: cores, or storage (because of memory when the split does
not fit the page cache). The recommendation is the format that reaches R with the fewest cores
(ties: fewer bytes per image); when none reaches R, the one that comes closest, with the short
resource and by how much. Scaling per-core rates to C cores assumes the rate per CPU-second holds
at that worker count; it is the figure a busy host does not distort (see comparison.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from imagenet_shards.hostbench.timing import BenchmarkError

ROW_PREFERENCE = ("device", "host")  # normalisation of the row that stands for a format
DEVICE_DECODE = "device-decode"  # a JPEG format's row with the JPEGs decoded on the accelerator: a choice of its own
LOCAL = "local"


@dataclass(frozen=True)
class Ceiling:
    transport: str  # "local", "http", "s3"
    mb_per_s: float
    row: str  # the transport_ceiling row id


@dataclass(frozen=True)
class Candidate:
    """One format's figures, as measured."""

    format: str
    row: str
    images_per_cpu_s: float
    images_per_s: float
    workers_measured: int
    bytes_per_image: float
    ceiling: Ceiling | None


def candidates(rows: list, bytes_per_image: dict) -> list:
    """One Candidate per format with a measured loader row. `bytes_per_image`: {format: stored bytes per
    image}; a format missing there takes it from its row (MB/s / images/s). Storage ceilings come from the
    transport_ceiling rows: a remote copy's when measured (the data is there), else the local files'."""
    by_id = {row["id"]: row for row in rows if "error" not in row}
    formats = list(dict.fromkeys(row["format"] for row in rows if row.get("kind") == "loader"))
    found = []
    for fmt in formats:
        row = next((by_id[f"{fmt}/{n}"] for n in ROW_PREFERENCE if f"{fmt}/{n}" in by_id), None)
        if row is None or not row.get("images_per_cpu_s"):
            continue
        size = bytes_per_image.get(fmt) or (row["mb_per_s"] * 1e6 / row["images_per_s"] if row.get("images_per_s")
                                             else 0.0)
        found.append(Candidate(fmt, row["id"], float(row["images_per_cpu_s"]), float(row["images_per_s"]),
                               int(row.get("workers") or 0), float(size), _ceiling(rows, fmt)))
        device = by_id.get(f"{fmt}/device-{DEVICE_DECODE}")
        if device is not None and device.get("images_per_cpu_s"):  # host cores per image with the decode moved off
            found.append(Candidate(f"{fmt} (JPEG decode on the device)", device["id"], float(device["images_per_cpu_s"]),
                                   float(device["images_per_s"]), int(device.get("workers") or 0), float(size),
                                   _ceiling(rows, fmt)))
    return found


def decode_location_note(rows: list) -> str:
    """What the decision says of where JPEGs are decoded: priced from device-decode rows, or not measured."""
    if any(row.get("id", "").endswith(f"/device-{DEVICE_DECODE}") and "error" not in row for row in rows):
        return ("decode location priced: each JPEG format's device-decode row counts the host cores left to read, "
                "verify and draw crops; the accelerator's own decode time is not in that row")
    return ("decode on the device: not measured (no CUDA device on this host); on a GPU host, --compare adds "
            "<format>/device-device-decode rows and this decision prices them")


def _ceiling(rows: list, fmt: str) -> Ceiling | None:
    measured = [row for row in rows if row.get("kind") == "transport_ceiling" and "error" not in row
                and row["id"].split("/", 1)[-1].split("@")[0] == fmt and row.get("mb_per_s")]
    remote = [row for row in measured if row.get("transport") != LOCAL]
    chosen = min(remote or measured, key=lambda row: row["mb_per_s"], default=None)
    return None if chosen is None else Ceiling(chosen.get("transport", LOCAL), float(chosen["mb_per_s"]), chosen["id"])


@dataclass(frozen=True)
class Assessment:
    """The arithmetic for one format at the target (all rates per instance unless named per host)."""

    format: str
    row: str
    images_per_cpu_s: float
    bytes_per_image: float
    cores_needed: float
    workers: int
    mb_per_s_needed_per_host: float
    split_gb: float
    fits_page_cache: bool
    storage: str  # where the epoch's bytes come from: "page cache", "<transport> ceiling", "not measured"
    ceiling_mb_per_s: float | None
    rate_by_cores: float
    rate_by_storage: float | None
    max_rate: float
    limited_by: str  # "cores", "storage", "memory (then storage)"
    meets_target: bool
    short: str  # "" or what is short and by how much
    images_per_s_measured: float  # the row's own wall-clock rate, at its worker count (for the chart)
    workers_measured: int


def assess(candidate: Candidate, target_rate: float, instances: int, cores_per_instance: float,
           split_images: int, page_cache_bytes: float) -> Assessment:
    cores_needed = target_rate / candidate.images_per_cpu_s
    mb_needed = instances * target_rate * candidate.bytes_per_image / 1e6
    split_bytes = split_images * candidate.bytes_per_image
    fits = split_bytes <= page_cache_bytes
    ceiling = candidate.ceiling
    if ceiling is not None and ceiling.transport == LOCAL and fits:
        storage, rate_by_storage = "page cache", None  # read from memory after the first epoch
    elif ceiling is None:
        storage, rate_by_storage = ("page cache", None) if fits else ("not measured", None)
    else:
        storage = f"{ceiling.transport} ceiling"
        rate_by_storage = ceiling.mb_per_s * 1e6 / candidate.bytes_per_image / instances
    rate_by_cores = cores_per_instance * candidate.images_per_cpu_s
    max_rate = rate_by_cores if rate_by_storage is None else min(rate_by_cores, rate_by_storage)
    if rate_by_storage is not None and rate_by_storage < rate_by_cores:
        limited_by = "storage" if fits or ceiling.transport != LOCAL else "memory (then storage)"
    else:
        limited_by = "cores"
    meets = max_rate >= target_rate
    short = []
    if cores_needed > cores_per_instance:
        short.append(f"cores: needs {cores_needed:,.2f} per instance, has {cores_per_instance:g} "
                     f"(short {cores_needed - cores_per_instance:,.2f})")
    if rate_by_storage is not None and rate_by_storage < target_rate:
        short.append(f"storage: needs {mb_needed:,.1f} MB/s per host, the {ceiling.transport} ceiling is "
                     f"{ceiling.mb_per_s:,.1f} (short {mb_needed - ceiling.mb_per_s:,.1f} MB/s"
                     + (f"; the {split_bytes / 1e9:,.2f} GB split does not fit the {page_cache_bytes / 1e9:,.1f} GB "
                        f"page cache" if not fits and ceiling.transport == LOCAL else "") + ")")
    return Assessment(candidate.format, candidate.row, candidate.images_per_cpu_s, candidate.bytes_per_image,
                      cores_needed, max(1, math.ceil(cores_needed - 1e-9)), mb_needed, split_bytes / 1e9, fits,
                      storage, None if ceiling is None else ceiling.mb_per_s, rate_by_cores, rate_by_storage,
                      max_rate, limited_by, meets, "; ".join(short), candidate.images_per_s,
                      candidate.workers_measured)


def recommend(rows: list, *, target_rate: float, instances: int = 1, cores_per_instance: float,
              split_images: dict, bytes_per_image: dict, page_cache_bytes: float) -> dict:
    """The decision as a JSON-ready dict: inputs, one assessment per format, the chosen format and
    worker count, and one sentence of why. `split_images`: {format: images in the split the
    decision is for}. BenchmarkError when no format has a measured loader row."""
    if target_rate <= 0 or instances < 1 or cores_per_instance <= 0:
        raise BenchmarkError("--target-rate, --instances and --cores-per-instance must be positive")
    found = candidates(rows, bytes_per_image)
    if not found:
        raise BenchmarkError("no format has a measured loader row to recommend from")
    assessed = [assess(c, target_rate, instances, cores_per_instance, int(split_images.get(c.format, 0)),
                       page_cache_bytes) for c in found]
    meeting = sorted((a for a in assessed if a.meets_target), key=lambda a: (a.cores_needed, a.bytes_per_image))
    chosen = meeting[0] if meeting else max(assessed, key=lambda a: a.max_rate)
    if meeting:
        why = (f"{chosen.format} reaches {target_rate:,.0f} img/s per instance with the fewest cores "
               f"({chosen.cores_needed:,.2f} of {cores_per_instance:g}: {chosen.images_per_cpu_s:,.0f} img per "
               f"CPU-second), and its {chosen.mb_per_s_needed_per_host:,.1f} MB/s per host "
               + ("is served from the page cache" if chosen.storage == "page cache" else
                  f"is within the {chosen.storage} of {chosen.ceiling_mb_per_s:,.1f} MB/s" if chosen.ceiling_mb_per_s
                  else "was not checked against a storage ceiling (none measured)") + ".")
    else:
        why = (f"no format reaches {target_rate:,.0f} img/s per instance on this host; the closest is "
               f"{chosen.format} at {chosen.max_rate:,.0f} img/s, short of {chosen.short}.")
    return {
        "target_rate": target_rate, "instances": instances, "cores_per_instance": cores_per_instance,
        "page_cache_gb": page_cache_bytes / 1e9, "split_images": split_images,
        "formats": [asdict(a) for a in assessed],
        "recommended": {"format": chosen.format, "dataloader_worker": chosen.workers, "row": chosen.row,
                        "meets_target": chosen.meets_target},
        "why": why,
        "decode_location": decode_location_note(rows),
    }


COLUMNS = (
    ("format", 8, lambda a: a["format"]),
    ("img/CPU-s", 9, lambda a: f"{a['images_per_cpu_s']:,.0f}"),
    ("cores", 6, lambda a: f"{a['cores_needed']:,.2f}"),
    ("workers", 7, lambda a: str(a["workers"])),
    ("KB/img", 7, lambda a: f"{a['bytes_per_image'] / 1e3:,.1f}"),
    ("MB/s host", 9, lambda a: f"{a['mb_per_s_needed_per_host']:,.1f}"),
    ("split GB", 8, lambda a: f"{a['split_gb']:,.2f}" + ("" if a["fits_page_cache"] else "!")),
    ("storage", 14, lambda a: a["storage"]),
    ("ceil MB/s", 9, lambda a: "-" if a["ceiling_mb_per_s"] is None else f"{a['ceiling_mb_per_s']:,.1f}"),
    ("max img/s", 9, lambda a: f"{a['max_rate']:,.0f}"),
    ("limited by", 0, lambda a: a["limited_by"] + ("" if a["meets_target"] else "  SHORT: " + a["short"])),
)


def format_recommendation(decision: dict) -> str:
    """The arithmetic as a small table, then the recommendation and its reason."""
    def line(cells):
        return "  ".join(cell.ljust(w) if n in ("format", "storage", "limited by") else cell.rjust(w)
                         for (n, w, _), cell in zip(COLUMNS, cells)).rstrip()

    rows = [line([c[0] for c in COLUMNS]), line(["-" * max(c[1], 5) for c in COLUMNS])]
    rows += [line([cell(a) for _, _, cell in COLUMNS]) for a in decision["formats"]]
    chosen = decision["recommended"]
    head = (f"Recommendation for {decision['target_rate']:,.0f} img/s per instance x {decision['instances']} "
            f"instance(s), {decision['cores_per_instance']:g} cores each, page cache "
            f"{decision['page_cache_gb']:,.1f} GB (cores = target / img/CPU-s; workers = ceil(cores); MB/s host = "
            f"instances x target x KB/img; '!': the split does not fit the page cache):")
    verdict = (f"=> --format {chosen['format']} with --dataloader-worker {chosen['dataloader_worker']}"
               if chosen["meets_target"] else f"=> none reaches the target; closest: {chosen['format']}")
    return "\n".join([head, *rows, verdict, decision["why"], decision.get("decode_location", "")]).rstrip()


def plot_recommendation(path, decision: dict) -> None:
    """images/s per instance against worker count for each format (min of workers x per-core rate and
    its storage rate), the measured rate at the measured worker count as a diamond, and the target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from imagenet_shards.fileio import atomic_open

    target = decision["target_rate"]
    most = max(max(a["workers"] for a in decision["formats"]) + 2, math.ceil(decision["cores_per_instance"]) + 1)
    figure, axis = plt.subplots(figsize=(9, 5.5), layout="constrained")
    for assessment in decision["formats"]:
        workers = list(range(1, most + 1))
        storage = assessment["rate_by_storage"]
        rates = [min(w * assessment["images_per_cpu_s"], storage if storage is not None else math.inf)
                 for w in workers]
        chosen = assessment["format"] == decision["recommended"]["format"]
        line, = axis.plot(workers, rates, marker="o", markersize=3, linewidth=2.4 if chosen else 1.2,
                          label=f"{assessment['format']} ({assessment['images_per_cpu_s']:,.0f} img/CPU-s"
                                + (f", storage {storage:,.0f} img/s" if storage is not None else "") + ")")
        # The row as measured (wall clock, at its worker count): below its line where other programs
        # took CPU time from it.
        axis.plot([max(1, assessment["workers_measured"])], [assessment["images_per_s_measured"]], marker="D",
                  markersize=7, color=line.get_color(), markeredgecolor="black", linestyle="none")
    axis.axhline(target, color="#b71c1c", linestyle="--", linewidth=1.2)
    axis.text(1, target, f" target {target:,.0f} img/s per instance", color="#b71c1c", va="bottom", fontsize=9)
    axis.axvline(decision["cores_per_instance"], color="#616161", linestyle=":", linewidth=1)
    axis.text(decision["cores_per_instance"], 0, f" {decision['cores_per_instance']:g} cores per instance",
              rotation=90, va="bottom", ha="right", fontsize=8, color="#616161")
    axis.set_xlabel("--dataloader-worker (one core each)")
    axis.set_ylabel("images/s per instance")
    axis.set_ylim(bottom=0)
    axis.grid(linestyle=":", alpha=0.6)
    axis.plot([], [], marker="D", color="#9e9e9e", markeredgecolor="black", linestyle="none",
              label="measured img/s (wall clock) at the run's worker count")
    axis.legend(fontsize=8)
    chosen = decision["recommended"]
    axis.set_title(f"{decision['instances']} instance(s): "
                   + (f"--format {chosen['format']} --dataloader-worker {chosen['dataloader_worker']}"
                      if chosen["meets_target"] else f"no format reaches the target (closest: {chosen['format']})"),
                   fontsize=10)
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    plt.close(figure)
