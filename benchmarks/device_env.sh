# Sourced by the run_*_gpu.sh scripts on a GPU machine (from the repository root): installs the
# wheels in $LAYERSLIDE_WHEELS (default .whl/: simpy, and what a script says it needs) into
# /tmp/site, puts them and the repo on PYTHONPATH, and sets $out to $OUT (or /tmp/out) and
# creates it. Scratch files on the drive under test go under $LAYERSLIDE_NVME_DIR (default /tmp).
# Stops the calling script if the install fails: every run after it would fail on a missing import.
if compgen -G "${LAYERSLIDE_WHEELS:-.whl}/*.whl" > /dev/null; then  # none: all installed already
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "${LAYERSLIDE_WHEELS:-.whl}"/*.whl \
        || { echo "installing the wheels in ${LAYERSLIDE_WHEELS:-.whl} failed"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
