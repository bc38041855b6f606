#!/bin/bash
# Slurm: start a Ray cluster over the allocated nodes, then run one agentrt workload on it.
# Submit one of the three run kinds with its config (on shared storage):
#   sbatch examples/cluster/slurm.sh train      examples/cluster/grpo_cluster.yaml
#   sbatch examples/cluster/slurm.sh tournament examples/cluster/league_cluster.yaml
#   sbatch examples/cluster/slurm.sh decompose  examples/cluster/decompose_cluster.yaml
# Resubmitting the same command resumes the run from its last checkpoint (same run_dir).
#SBATCH --job-name=agentrt
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-task=1
#SBATCH --time=24:00:00
set -euo pipefail

KIND=${1:?usage: sbatch slurm.sh train|tournament|decompose CONFIG}
CONFIG=${2:?usage: sbatch slurm.sh train|tournament|decompose CONFIG}
case "$KIND" in
    train) RUN=(agentrt train) ;;
    tournament) RUN=(agentrt tournament run) ;;
    decompose) RUN=(agentrt decompose run) ;;
    *) echo "slurm.sh: unknown run kind '$KIND': train, tournament or decompose" >&2; exit 2 ;;
esac
# The config is checked before any node starts Ray: a bad field is one line, here.
agentrt check-config "$CONFIG" --kind "$KIND" --no-prompt > /dev/null

PORT=6379
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{print $1}')

# Ray's token authentication: every node and the driver share this job's token (srun passes
# the environment on). Nodes of one job trust each other and nothing else.
RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_MODE RAY_AUTH_TOKEN

# Head node: Ray head (also a worker: it has a GPU like the others). Each node offers
# node_<i> as a custom resource, so a config can pin a pool to a node (resources.custom).
srun --nodes=1 --ntasks=1 -w "$head" \
    ray start --head --node-ip-address="$head_ip" --port=$PORT \
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --resources='{"node_0": 1}' --block &
sleep 15

# Every other node joins the head.
i=1
for node in "${nodes[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "$node" \
        ray start --address="$head_ip:$PORT" \
        --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --resources="{\"node_$i\": 1}" --block &
    i=$((i + 1))
done
sleep 15

# The driver (controller) runs on the head and joins the cluster; Ctrl-C / scancel leave the
# last checkpoint resumable: submit again with the same run_dir to resume.
srun --nodes=1 --ntasks=1 --overlap -w "$head" \
    "${RUN[@]}" "$CONFIG" --set runtime.address="$head_ip:$PORT"
