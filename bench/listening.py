"""Issue 41, must-show 5: ``ss -ltnp`` while a Ray run's 2-worker pool is up (a gloo process
group with its TCP store): every socket of the run's processes listens on loopback.

    .venv/bin/python bench/listening.py

Starts Ray as every agentrt run does (a local Ray: 127.0.0.1), a data-parallel pool of 2 workers
on llama-tiny, generates once, then prints ``ss -ltnp``'s lines of this process and everything
it started (Ray's GCS, raylet, agents, both workers) and whether each local address is a
loopback one. Exits 1 if any is not. Sockets of other programs on the machine are counted, not
judged (they are not agentrt's).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from agentrt.config.sections import ModelConfig, PolicyConfig, RuntimeConfig
from agentrt.policies.models import build_model
from agentrt.runtime.ray_pool import PolicyPool, ensure_ray, is_loopback


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="listening-") as tmp:
        model = build_model(Path(tmp) / "m", "llama-tiny", seed=0)
        assert ensure_ray(RuntimeConfig(num_cpus=2))
        pool = PolicyPool(PolicyConfig(model=ModelConfig(path=str(model)),
                                       resources={"num_workers": 2, "cpus_per_worker": 1}),
                          seed=0, workdir=tmp)
        try:
            assert pool.generate([[1, 2, 3]])
            me = psutil.Process()
            ours = {p.pid for p in [me, *me.children(recursive=True)]}
            lines = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True,
                                   check=True).stdout.splitlines()
        finally:
            pool.shutdown()
    print(lines[0])
    exposed, others = 0, 0
    for line in lines[1:]:
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if not pids & ours:
            others += 1
            continue
        host = line.split()[3].rsplit(":", 1)[0].strip("[]")
        local = host not in ("*", "0.0.0.0", "::") and is_loopback(host.split("%")[0])
        exposed += not local
        print(f"{line}   {'loopback' if local else 'NOT LOOPBACK'}")
    print(f"2 pool workers (pids {pool.pids}); {len(ours)} processes of this run; "
          f"{exposed} of their listening sockets beyond loopback; {others} sockets of other "
          "programs not judged")
    return 1 if exposed else 0


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(main())
