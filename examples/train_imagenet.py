#!/usr/bin/env python
"""Train a torchvision ResNet from ImageNet shards: a training loop to copy.

It shows how the pieces fit: the launcher (torchrun, poprun, SLURM: `imagenet_shards.launcher`), the loader
(`get_data`, one share per instance), uint8 batches normalised on the accelerator
(`NormalizeOnDevice`), DistributedDataParallel (nccl on GPUs, gloo on CPU), SGD with a cosine
schedule, an optional strong-augmentation recipe, checkpoints every N steps and `--resume`.

    torchrun --nproc_per_node 8 examples/train_imagenet.py --data /data/imagenet-img --epochs 90 \\
        --batch-size 256 --workers 8 [--strong-aug] [--checkpoint ckpt.pt --checkpoint-every 1000 --resume]
    # a small CPU run (2 processes, gloo)
    torchrun --nproc_per_node 2 examples/train_imagenet.py --data sample-img --arch resnet18 \\
        --image-size 64 --batch-size 16 --workers 1 --max-steps 20 --no-val

Per step it prints the images/s and the data-wait fraction: the time the step waited for the
loader divided by the step's time. Near 0 the host keeps up with the accelerator; a large fraction
says the input pipeline is the bottleneck (more workers, the `tensor` format, fewer host-side
augmentations; `host_benchmark.py --compare` prices each per CPU-second).

Resume: the checkpoint holds every instance's loader state (`state_dict()`, a few hundred bytes
each, gathered to rank 0). With the same instance count the resumed run continues with exactly the
batches (samples and pixels) the uninterrupted run would have had; with another count the loader
deals what no instance had delivered yet in that epoch (`load_state_dict` of the list). A checkpoint
without loader states (written by an earlier version) is resumed by replaying the epoch's plan and
skipping the batches already done. `--order global --global-batch-size G` keys the order by G: the
same global batches (and pixels) on any instance count, so a resume onto another count with G kept
continues with the uninterrupted run's next global batch (the per-instance batch becomes G/N; the
learning rate, scaled by G, stays). `--ledger DIR` writes each instance's order ledger at every
epoch's end: `python -m imagenet_shards.ledger verify DIR/epoch0-*.json` proves the epoch delivered every
sample once.

Exit codes: 0 done, 1 a data problem, 2 a usage problem (bad options, a checkpoint that does not
match the run).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # run from a checkout; after `pip install -e .` the library is found anyway


def fail(message: str, code: int = 2):
    """One line on stderr, then exit (2: usage, 1: data)."""
    print(f"train_imagenet.py: {message}", file=sys.stderr)
    sys.exit(code)


import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from imagenet_shards.loader import (Cache, GlobalOrder, Normalization, NormalizeOnDevice, SourceError,  # noqa: E402
                                     TrainCrop, ValidationCrop, get_data, is_worker_death, mixup_cutmix,
                                     strong_augmentation)
from imagenet_shards.training import CpuMeter, Error, LauncherError, detect_instance, exit_code, torchvision  # noqa: E402,E501

CHECKPOINT_VERSION = 1
MUST_MATCH = ("data", "seed", "batch_size", "world_size", "image_size", "strong_aug")  # for a skip-based resume


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="converted dataset (folder, http(s)://, s3://) or 'synthetic'")
    p.add_argument("--arch", default="resnet50", help="a torchvision.models name (resnet50, resnet18, ...)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per instance (default 256; with --global-batch-size derived as G / the instance count)")
    p.add_argument("--order", default="shards", choices=("shards", "global"),
                   help="the train order: 'global' gives the same global batches at any instance/worker count and "
                        "across a resume onto another count (get_data's GlobalOrder)")
    p.add_argument("--global-batch-size", type=int, default=None,
                   help="G, every step's samples over all instances (implies --order global); keep it across a "
                        "resume onto another instance count")
    p.add_argument("--workers", type=int, default=8, help="DataLoader workers per instance")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1, help="for a global batch of 256, scaled linearly")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--strong-aug", action="store_true",
                   help="RandomResizedCrop + flip + TrivialAugmentWide + RandomErasing, MixUp/CutMix per batch")
    p.add_argument("--normalization", default="device", choices=("device", "host"))
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-val", action="store_true", help="skip the validation pass after each epoch")
    p.add_argument("--checkpoint", default="checkpoint.pt")
    p.add_argument("--checkpoint-every", type=int, default=1000, help="steps; 0: only at the end of an epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--print-every", type=int, default=1)
    p.add_argument("--ledger", default=None, help="directory: each rank writes epoch<E>-rank<R>.json, its order ledger")
    p.add_argument("--keys-log", default=None, help="directory: each rank appends its batches' keys per step")
    p.add_argument("--step-log", default=None,
                   help="file: rank 0 appends one JSON line per step (images, data wait and step time in s, loss)")
    p.add_argument("--decode", default="host", choices=("host", "device"),
                   help="where train and validation JPEGs are decoded: host (the DataLoader workers) or device "
                        "(the accelerator's JPEG decoder: get_data(jpeg_decode='device'))")
    p.add_argument("--fixed-batch", action="store_true",
                   help="benchmark: train on the first batch, kept on the device, again and again: the "
                        "accelerator's own rate with no loader")
    p.add_argument("--cache-dir", default=None,
                   help="the node's shard cache for a remote --data (get_data's cache_dir; docs/shard-cache.md)")
    p.add_argument("--cache-limit", default=None, help="the cache's size limit, e.g. 20GB (get_data's cache_limit)")
    p.add_argument("--kill-at-step", type=int, default=None, help=argparse.SUPPRESS)  # tests: SIGKILL rank 0 there
    # benchmarks/soak.py: rank 0 SIGKILLs itself in the middle of writing the checkpoint of this step
    p.add_argument("--kill-in-checkpoint-write", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if (args.batch_size is not None and args.batch_size < 1) or args.workers < 0 or args.image_size < 8 or \
            (args.global_batch_size is not None and args.global_batch_size < 1):
        p.error("--batch-size and --global-batch-size must be >= 1, --workers >= 0, --image-size >= 8")
    if args.global_batch_size is not None:
        args.order = "global"
    if args.arch not in torchvision.models.list_models(module=torchvision.models):
        p.error(f"--arch {args.arch}: not a torchvision classification model")
    prepare_output_paths(args)
    return args


def prepare_output_paths(args) -> None:
    """Create the folders the output options write into (every rank may; exist_ok), or exit 2 in one line."""
    folders = {"--keys-log": args.keys_log, "--ledger": args.ledger}
    files = {"--step-log": args.step_log, "--checkpoint": args.checkpoint}
    wanted = [(option, Path(path)) for option, path in folders.items() if path]
    wanted += [(option, Path(path).parent) for option, path in files.items() if path]
    for option, folder in wanted:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            fail(f"{option}: {folder} exists and is not a folder")
        except OSError as error:
            fail(f"{option}: cannot create the folder {folder}: {error.strerror or error}")
    for option, path in files.items():
        if path and Path(path).is_dir():
            fail(f"{option} {path}: is a folder; give a file name")


def setup_distributed():
    """(instance, device): the launcher's instance; a process group when there are several."""
    instance = detect_instance()
    cuda = torch.cuda.is_available()
    local = instance.local_rank if instance.local_rank is not None else int(os.environ.get("SLURM_LOCALID", 0))
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if instance.count > 1:
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise LauncherError(f"{instance.describe()}: set {' and '.join(missing)} for the process group "
                                f"(torchrun sets them; under srun or poprun export the first host and a free port)")
        dist.init_process_group("nccl" if cuda else "gloo", rank=instance.index, world_size=instance.count)
    return instance, device


def per_instance_batch(args, instance) -> int:
    """--batch-size, or G / the instance count under --global-batch-size (a --batch-size given must equal it)."""
    g = args.global_batch_size
    if g is None:
        return 256 if args.batch_size is None else args.batch_size
    if g % instance.count or (args.batch_size is not None and args.batch_size * instance.count != g):
        fail(f"--global-batch-size {g} is not --batch-size x {instance.count} instances"
             + ("" if g % instance.count else f" (give --batch-size {g // instance.count} or none)"))
    return g // instance.count


def make_loaders(args, instance):
    args.batch_size = per_instance_batch(args, instance)
    order = GlobalOrder(global_batch_size=args.global_batch_size) if args.order == "global" else None
    common = dict(batch_size=args.batch_size, workers=args.workers,
                  normalization=Normalization(args.normalization, channels_last=args.channels_last),
                  seed=args.seed, instance=instance, pin_memory=torch.cuda.is_available(), with_keys=True,
                  jpeg_decode="device" if args.decode == "device" else None)
    if args.cache_dir:
        common.update(cache=Cache(args.cache_dir, limit=args.cache_limit))
    transform = strong_augmentation(args.image_size) if args.strong_aug else TrainCrop(image_size=args.image_size)
    train = get_data(args.data, "train", transform=transform, order=order, **common)
    if args.strong_aug:  # MixUp/CutMix need the class count, which the loader read from the dataset
        train = get_data(args.data, "train", transform=transform, batch_transform=mixup_cutmix(len(train.classes)),
                         order=order, **common)
    val = None if args.no_val else get_data(args.data, "validation",
                                            transform=ValidationCrop(image_size=args.image_size), **common)
    return train, val


def save_checkpoint(path, model, optimizer, scheduler, train, position, args, instance):
    """Rank 0 writes the checkpoint atomically (a killed write leaves the previous one intact), with
    every rank's loader state (so a resume onto another instance count knows what each delivered)."""
    loader_states = [None] * instance.count
    if instance.count > 1:
        dist.all_gather_object(loader_states, train.state_dict())  # every rank takes part
    else:
        loader_states[0] = train.state_dict()
    if instance.index != 0:
        return
    state = {"version": CHECKPOINT_VERSION, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), **position,
             "run": {**{k: getattr(args, k) for k in MUST_MATCH if hasattr(args, k)}, "world_size": instance.count},
             "loader": json.dumps(loader_states)}
    tmp = Path(f"{path}.tmp")
    torch.save(state, tmp)
    # the first write at or after the step: a restart that resumed past it still meets one (the soak)
    if args.kill_in_checkpoint_write is not None and position["global_step"] >= args.kill_in_checkpoint_write:
        os.truncate(tmp, tmp.stat().st_size // 2)  # half written, as a kill in the middle of torch.save leaves it
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(tmp, path)


def load_checkpoint(path, args, instance):
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        fail(f"--resume: {path} does not exist")
    run = {**{k: getattr(args, k) for k in MUST_MATCH if hasattr(args, k)}, "world_size": instance.count}
    differ = [f"{k} {state['run'].get(k)!r} -> {v!r}" for k, v in run.items() if state["run"].get(k) != v]
    # With the loaders' states any instance count resumes (the loader refuses another dataset or seed);
    # replaying the plan (an earlier checkpoint without them) needs the same run.
    if state.get("version") != CHECKPOINT_VERSION or (differ and state.get("loader") is None and state.get("step_in_epoch", 1)):
        fail(f"{path} was written by another run ({'; '.join(differ) or 'version'}); resuming mid-epoch needs "
             f"the same values")
    return state


def restore_loader(train, state) -> int:
    """Put the loader where the checkpoint left it; returns the batches of that epoch still to skip.

    Mid-epoch, every rank's loader state is loaded (the loader continues exactly, or deals what was
    left onto another instance count); at an epoch's end there is nothing to restore. A checkpoint
    without loader states is resumed by replaying the epoch's plan and dropping the batches done.
    """
    train.set_epoch(state["epoch"])
    if not state["step_in_epoch"]:
        return 0
    if state.get("loader") is not None:
        try:
            train.load_state_dict(json.loads(state["loader"]))
        except ValueError as error:  # ResumeError: another dataset, seed, split... named
            fail(f"--resume: the loader cannot continue from {state.get('path', 'the checkpoint')}: {error}")
        return 0
    return state["step_in_epoch"]


def evaluate(model, val, device, instance) -> float:
    """Top-1 over every validation sample once (the loader's "spread" policy), across instances.

    Uses the bare model: instances may get one batch more or less, and DDP's forward would wait
    for a peer that has none."""
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for images, labels, _ in val:
            logits = model(images.to(device, non_blocking=True))
            correct[0] += (logits.argmax(1).cpu() == labels).sum().item()
            correct[1] += len(labels)
    if instance.count > 1:
        dist.all_reduce(correct)
    model.train()
    return float(correct[0] / max(correct[1], 1))


class Training:
    """What the loop works with: the model (bare, and wrapped in DDP when there are several instances),
    its optimiser, schedule and loss, the steps to run, and the logs a step writes."""

    def __init__(self, args, instance, device, train):
        num_classes = len(train.classes) if train.classes else 1000
        net = torchvision.models.get_model(args.arch, num_classes=num_classes)
        self.model = NormalizeOnDevice(net).to(device)
        if args.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        if instance.count > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        else:
            self.ddp = self.model
        lr = args.lr * args.batch_size * instance.count / 256
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=args.momentum,
                                         weight_decay=args.weight_decay)
        epochs_steps = args.epochs * len(train)
        self.total = epochs_steps if args.max_steps is None else min(args.max_steps, epochs_steps)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=max(self.total, 1))
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
        self.log = self.step_log = self.cpu = None
        self.waited = DataWait()

    def resume(self, args, instance, train):
        """(epoch, global step, batches to skip, batches done in the epoch) from --checkpoint."""
        state = load_checkpoint(args.checkpoint, args, instance)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        start_epoch, step, skip = state["epoch"], state["global_step"], restore_loader(train, state)
        done_in_epoch = state["step_in_epoch"]
        if instance.index == 0:
            how = f"{skip} batches skipped by replaying its plan" if skip else "the loader continues from its state"
            print(f"resumed from {args.checkpoint}: epoch {start_epoch}, step {step}, {done_in_epoch} batches "
                  f"into the epoch ({how})", flush=True)
        return start_epoch, step, skip, done_in_epoch

    def open_logs(self, args, instance):
        self.log = open(Path(args.keys_log) / f"rank{instance.index}.jsonl", "a") if args.keys_log else None
        self.step_log = open(args.step_log, "a") if args.step_log and instance.index == 0 else None
        # the process's and its workers' CPU seconds, in the step log
        self.cpu = CpuMeter() if self.step_log else None
        if self.cpu:
            self.cpu.start()

    def checkpoint(self, args, instance, train, position):
        save_checkpoint(args.checkpoint, self.model, self.optimizer, self.scheduler, train, position, args, instance)


def train_loop(args, instance, device):
    train, val = make_loaders(args, instance)
    if instance.index == 0:
        print(f"{instance.describe()}; {len(train)} batches of {args.batch_size} per instance per epoch",
              flush=True)
    run = Training(args, instance, device, train)
    start_epoch, step, skip, done_in_epoch = run.resume(args, instance, train) if args.resume else (0, 0, 0, 0)
    run.open_logs(args, instance)

    for epoch in range(start_epoch, args.epochs):
        if not (args.resume and epoch == start_epoch):  # restore_loader set the resumed epoch
            train.set_epoch(epoch)
        batches = epoch_batches(train, args, device)
        for _ in range(skip):
            next(batches)
        step = train_epoch(args, instance, device, run, train, batches, epoch, step, done_in_epoch)
        skip, done_in_epoch = 0, 0
        if args.ledger:
            Path(args.ledger).mkdir(parents=True, exist_ok=True)
            train.write_ledger(Path(args.ledger) / f"epoch{epoch}-rank{instance.index}.json")
        if step >= run.total:
            break
        run.checkpoint(args, instance, train, {"epoch": epoch + 1, "step_in_epoch": 0, "global_step": step})
        if val is not None:
            top1 = evaluate(run.model, val, device, instance)
            if instance.index == 0:
                print(f"epoch {epoch}: validation top-1 {top1:.2%}; {train.report.summary()}", flush=True)
    if instance.index == 0:
        print(f"done: {step} steps; {run.waited.summary()}", flush=True)
        print(f"final parameters sha256 {parameter_digest(run.model)}", flush=True)


def parameter_digest(model) -> str:
    """sha256 over the model's state (names, dtypes, shapes and bytes, in order): two runs that end with
    bit-identical weights and buffers print the same digest."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train_epoch(args, instance, device, run, train, batches, epoch, step, in_epoch) -> int:
    """The steps of one epoch (from `in_epoch` batches into it) until its batches or the steps run out;
    the global step reached."""
    while step < run.total:
        t0 = time.perf_counter()
        try:
            images, labels, keys = next(batches)
        except StopIteration:
            break
        t1 = time.perf_counter()
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
            loss = run.criterion(run.ddp(images), labels)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
        run.scheduler.step()
        loss_value = loss.item()  # waits for the device: the step's time is its real time
        t2 = time.perf_counter()
        step, in_epoch = step + 1, in_epoch + 1
        log_step(args, instance, run, epoch, step, images, keys, loss_value, (t0, t1, t2))
        position = {"epoch": epoch, "step_in_epoch": in_epoch, "global_step": step}
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            run.checkpoint(args, instance, train, position)
            if instance.index == 0:
                print(f"checkpoint {args.checkpoint} at step {step}", flush=True)
        if args.kill_at_step == step and instance.index == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, for the resume test
    return step


def log_step(args, instance, run, epoch, step, images, keys, loss_value, times):
    """One step into the keys log, the step log, the data-wait figure and (every --print-every) stdout.
    `times`: (before the batch was asked for, when it arrived, when the step ended)."""
    t0, t1, t2 = times
    if run.log:
        run.log.write(json.dumps({"step": step, "epoch": epoch, "keys": keys, "ranks": instance.count,
                                  "pixels": int(images.sum().item())}) + "\n")
        run.log.flush()
    run.waited.add(len(keys), t1 - t0, t2 - t0)
    if run.step_log:
        run.cpu.sample()
        run.step_log.write(json.dumps({"epoch": epoch, "step": step, "images": len(keys), "wait_s": t1 - t0,
                                       "step_s": t2 - t0, "loss": loss_value, "cpu_s": sum(run.cpu.used()[:2])})
                           + "\n")
        run.step_log.flush()
    if instance.index == 0 and step % args.print_every == 0:
        rate = len(keys) / (t2 - t0)
        print(f"epoch {epoch} step {step}/{run.total} loss {loss_value:.4f} lr {run.scheduler.get_last_lr()[0]:.4g} "
              f"| {rate:,.0f} img/s per instance ({rate * instance.count:,.0f} all) "
              f"| data wait {(t1 - t0) / (t2 - t0):.0%} ({(t1 - t0) * 1e3:.1f} of {(t2 - t0) * 1e3:.1f} ms)",
              flush=True)


def epoch_batches(train, args, device):
    """The epoch's batches; with --fixed-batch its first one, on the device, for ever (no loader)."""
    batches = iter(train)
    if not args.fixed_batch:
        return batches
    images, labels, keys = next(batches)
    return itertools.repeat((images.to(device), labels.to(device), keys))


class DataWait:
    """The run's data-wait fraction: time blocked on the loader over step time, summed over the steps
    after the first WARMUP (the first steps wait for workers to start and the device to compile)."""

    WARMUP = 10

    def __init__(self):
        self.steps = self.images = 0
        self.wait = self.time = 0.0

    def add(self, images: int, wait: float, step_time: float) -> None:
        self.steps += 1
        if self.steps > self.WARMUP:
            self.images, self.wait, self.time = self.images + images, self.wait + wait, self.time + step_time

    def summary(self) -> str:
        if self.time <= 0:
            return f"data wait: not measured (no step after the first {self.WARMUP})"
        return (f"data wait {self.wait / self.time:.1%} of step time over steps {self.WARMUP + 1}-{self.steps} "
                f"({self.images / self.time:,.0f} img/s per instance)")


def one_line(error: BaseException) -> str:
    """The error's message; for one raised in a DataLoader worker, which torch re-raises with the worker's
    traceback in its text ("Caught X in DataLoader worker process N. Original Traceback ..."), the
    original error's own last line."""
    text = str(error)
    if "Original Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1]
        return last.split(": ", 1)[1] if ": " in last else last
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # the same initial weights on every instance
    try:
        instance, device = setup_distributed()
    except LauncherError as error:
        fail(str(error))
    try:
        train_loop(args, instance, device)
    except SourceError as error:  # no such path, no dataset there: a usage problem, as in the other commands
        fail(str(error))
    except Error as error:  # the library's own (a store down past the retries is a RuntimeError): it names the problem
        fail(f"{type(error).__name__}: {one_line(error)}", exit_code(error))
    except (OSError, ValueError) as error:
        fail(f"{type(error).__name__}: {one_line(error)}", 1)
    except RuntimeError as error:
        if not is_worker_death(error):
            raise
        # torch raised it from its SIGCHLD handler during a training step, not in the loader's iteration
        # (which names the shard: WorkerDiedError): one line all the same
        fail(f"WorkerDiedError: {one_line(error)}", 1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
