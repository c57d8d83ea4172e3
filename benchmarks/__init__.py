"""layerslide's benchmarks as named suites: `python -m benchmarks --list`, `python -m benchmarks
SUITE [--dry-run]`. A suite is one module in `benchmarks/suites/` (see `benchmarks.registry`);
the scripts the cases run live beside this file, one-off probes in `benchmarks/probes/`."""
