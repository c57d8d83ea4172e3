#!/usr/bin/env bash
# Issue 5 on the H200 benchmark machine, one call: a thorough `layerslide calibrate` (disk
# included), then the validation suite on that profile in the same lease (the lent machines
# differ by up to ~20%: a profile from another lease does not describe this one).
# usage (device): bash benchmarks/run_validation_gpu.sh [validate_sim.py args, e.g. --configs
#   3b-mb1-w2-host,3b-mb8-w2-host --deadline 420]
#   (wheels in $LAYERSLIDE_WHEELS, default .whl/: simpy). --deadline counts the validation
#   only: the thorough calibration before it took 124 s on the H200 machine at 64 Mi AdamW
#   blocks (validation_2026-12-03a), 269 s at 256 Mi with randn-filled test arrays (12-03c)
#   and 98-110 s at 256 Mi filled by a repeated pattern (validation_2026-12-04).
# Writes 7 files under $OUT (the device tool brings back 8 at most).
# A suite split over two calls on one warm machine shares one calibration: the first call
# keeps its profile in $PROFILE_KEPT, which a call finding it there uses instead of calibrating
# (kept per version of the calibration's code: a changed calibrate calibrates again).
set -uo pipefail
source benchmarks/device_env.sh
CALIBRATE_CODE=$(cat layerslide/calibrate/*.py layerslide/hwprofiles/*.py | md5sum | cut -c1-12)
PROFILE_KEPT=/tmp/layerslide-validation-profile-$CALIBRATE_CODE.toml
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme" /tmp/traces  # traces.tar.gz holds this call's rows alone
if [ -s "$PROFILE_KEPT" ]; then
    echo "this machine's calibration from an earlier call: $PROFILE_KEPT"
    cp "$PROFILE_KEPT" "$out/h200-calibrated.toml"
else
    mkdir -p "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"  # calibrate measures only a folder that exists
    calibrate_start=$SECONDS
    python3 -c "import sys; from layerslide.cli.main import main; sys.exit(main())" calibrate \
        --out "$out/h200-calibrated.toml" --overwrite --disk-dir "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme" --ram 128GiB 2>&1 \
        | tail -30
    echo "the thorough calibration took $((SECONDS - calibrate_start)) s"
    [ -s "$out/h200-calibrated.toml" ] || { echo "calibration failed: no validation"; exit 1; }
    cp "$out/h200-calibrated.toml" "$PROFILE_KEPT"
fi
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
python3 benchmarks/validate_sim.py --profile "$out/h200-calibrated.toml" --nvme-dir "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme" \
    --traces /tmp/traces --out "$out" "$@" 2>&1 | grep -v -i warn | tee "$out/validate.log"
rm -rf "${LAYERSLIDE_NVME_DIR:-/tmp}/nvme"
tar czf "$out/traces.tar.gz" -C /tmp traces  # each configuration's measured and predicted trace
