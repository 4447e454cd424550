"""`bash .ci/gpu check`: what a lent GPU machine offers fineline, in one short run.

Prints the card, the versions of the packages fineline imports (from the kit or the image),
the registered tasks and models (their entry points come from the carried egg-info), the
numerics a run there records, and whether a local Ray sees the GPU and gives it to a task.
Exits non-zero if any of that fails.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys

import torch

smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True, check=False) if torch.cuda.is_available() else None
print("gpu:", smi.stdout.strip() if smi else "none")
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.cuda.is_available())
for name in ["ray", "optuna", "duckdb", "pydantic", "altair", "pyarrow", "pandas", "numpy", "scipy"]:
    print(f"  {name} {md.version(name)}")

from trainables.registry import MODELS, TASKS  # noqa: E402
from trainables.runtime import numerics  # noqa: E402

print("tasks:", ", ".join(sorted(t.name for t in TASKS)))
print("models:", ", ".join(sorted(m.name for m in MODELS)))
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print("numerics:", numerics(device))

import ray  # noqa: E402

ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
try:
    gpus = ray.cluster_resources().get("GPU", 0)
    print(f"ray {ray.__version__}: CPU {ray.cluster_resources().get('CPU')}, GPU {gpus}")

    @ray.remote(num_gpus=1 if gpus else 0)
    def where() -> str:
        import torch

        return f"a Ray task sees cuda={torch.cuda.is_available()} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"

    print(ray.get(where.remote()))
finally:
    ray.shutdown()
if torch.cuda.is_available() and not gpus:
    sys.exit("gpu: torch sees a GPU but Ray does not")
