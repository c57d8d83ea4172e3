"""`layerslide calibrate`: measure this machine into a hardware profile file."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from layerslide.cli.options import UsageError, byte_size, profile_of
from layerslide.outputs import writable_file


def add_calibrate_command(sub, units: str) -> None:
    help = ("measure this machine (host, disk, and the GPU where there is one) and write a "
            "hardware profile for simulate/tune/train --profile")
    p = sub.add_parser("calibrate", help=help, description=help, epilog=units)
    p.add_argument("--out", required=True, help="profile file to write (.toml)")
    p.add_argument("--name", help="the profile's name (default: the file's stem)")
    p.add_argument("--base", default="h200-bench",
                   help="profile whose values stand for what is not measured (the GPU's bf16 "
                        "peak, the DMA's share of host bandwidth; the GPU part on a machine "
                        "without one)")
    p.add_argument("--model", default="llama-3.2-3b",
                   help="model whose layer shapes the GEMMs and attention are measured at")
    p.add_argument("--disk-dir", help="folder on the disk to measure (the NVMe tier's), or "
                                      "several, comma-separated, one per drive (as train's "
                                      "--nvme-dir); default: no disk measurement")
    p.add_argument("--seq-len", type=int, default=1024,
                   help="sequence length attention is measured at (the profile's attention "
                        "tables hold for it)")
    p.add_argument("--ram", type=byte_size, default=None, metavar="SIZE",
                   help="RAM to record, e.g. 128GiB, where the machine reports less than it "
                        "has (RAM that grows as used); default: the physical pages")
    p.add_argument("--quick", action="store_true",
                   help="smaller arrays, fewer repeats and token counts (under a minute)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=cmd_calibrate)


def cmd_calibrate(args) -> int:
    import torch

    from layerslide.calibrate import measure, merged_profile
    from layerslide.hwprofiles.loader import load_profile
    from layerslide.hwprofiles.writer import save_profile
    from layerslide.planner.model import resolve_model

    out = Path(args.out)
    if out.suffix != ".toml":
        raise UsageError(f"--out {out}: a profile file ends in .toml")
    writable_file("--out", args.out, overwrite=args.overwrite)
    base = profile_of(args.base)
    model = resolve_model(args.model)
    gpu = torch.cuda.is_available()
    print(f"calibrating {'host, disk and GPU' if gpu else 'host and disk (no GPU here)'}"
          f"{' (quick)' if args.quick else ''}; unmeasured fields from {base.name}", flush=True)
    start = time.perf_counter()

    def progress(step: str) -> None:
        print(f"  [{time.perf_counter() - start:6.1f} s] {step}", file=sys.stderr, flush=True)

    if args.seq_len < 1:
        raise UsageError(f"--seq-len {args.seq_len}: must be >= 1")
    disk_dirs = []
    if args.disk_dir:
        from layerslide.executor.nvme import nvme_folders

        try:
            disk_dirs = nvme_folders(args.disk_dir)
        except ValueError as err:
            raise UsageError(f"--disk-dir {args.disk_dir}: {err}") from err
    for folder in disk_dirs:  # before minutes of measuring, not after
        _check_writable(folder)
    try:
        found = measure(quick=args.quick, model=model, peak_flops=base.gpu.bf16_flops_per_s,
                        disk_dir=disk_dirs or None, gpu=gpu,
                        seq_len=args.seq_len, ram_bytes=args.ram, progress=progress)
    except OSError as err:
        hint = (": pass a writable --disk-dir with 8 GiB free (2 GiB with --quick)"
                if args.disk_dir else "")
        raise UsageError(f"calibration failed: {err}{hint}") from err
    # written beside, read back, then put in place: a profile the loader refuses (e.g. GEMMs
    # faster than the base's bf16 peak) never lands as --out
    draft = out.with_name(f".{out.stem}.draft.toml")
    try:
        profile = merged_profile(base, found, name=args.name or out.stem, quick=args.quick)
        load_profile(save_profile(profile, draft))
    except ValueError as err:
        draft.unlink(missing_ok=True)
        raise UsageError(f"the measurements do not make a valid profile: {err}; if GEMMs "
                         f"beat {base.name}'s bf16 peak, pass a --base whose peak is this "
                         "GPU's") from err
    draft.replace(out)
    for m in found:
        shown = m.value if isinstance(m.value, str | tuple) else f"{m.value:.4g}"
        print(f"  {m.key:34s} {shown}")
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s: use it with --profile {out}")
    return 0


def _check_writable(folder: Path) -> None:
    if not folder.is_dir():  # measuring a folder it made would measure some other disk's
        raise UsageError(f"--disk-dir {folder} does not exist: pass a folder on the drive to "
                         "measure (make it first)")
    probe = folder / ".layerslide-calibrate-probe"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"--disk-dir {folder}: cannot write there ({err.strerror}): pass a "
                         "writable --disk-dir with 8 GiB free (2 GiB with --quick)") from err
