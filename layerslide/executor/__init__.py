"""The plan's interpreter: runs a `Plan` on a GPU (or the CPU) exactly as the planner wrote it.

- `engine.PlanEngine`: a thread per lane, each running its lane's tasks in the plan's order
  once their dependencies are done (`serial=True`: one at a time, the correctness oracle);
- `runner.TaskRunner`: one handler per task kind, reading the task's fields and buffers;
- `host_state.HostState`: the host's fp32 master weights, moments, landing buffers and the
  NVMe tier (`nvme`, `stripes`), sized by the plan's placement;
- `blocks`, `compute`, `grad_into_sum`, `gpu_updates`: the model's blocks and their kernels;
  `native` and `moments`: the one-pass CPU AdamW and the moments' formats;
- `device`, `memory`, `waits`: streams and events, memory samples, interruptible waits.

It decides no schedule and reads no training run: `layerslide.training` drives it.
"""
