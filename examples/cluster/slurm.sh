#!/bin/bash
# Slurm: start a Ray cluster over the allocated nodes, then run agentrt on it.
# Submit: sbatch examples/cluster/slurm.sh examples/cluster/grpo_cluster.yaml
#SBATCH --job-name=agentrt
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-task=1
#SBATCH --time=24:00:00
set -euo pipefail

CONFIG=${1:-examples/cluster/grpo_cluster.yaml}
PORT=6379
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{print $1}')

# Head node: Ray head (also a worker: it has a GPU like the others).
srun --nodes=1 --ntasks=1 -w "$head" \
    ray start --head --node-ip-address="$head_ip" --port=$PORT \
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --block &
sleep 15

# Every other node joins the head.
for node in "${nodes[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "$node" \
        ray start --address="$head_ip:$PORT" \
        --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus=1 --block &
done
sleep 15

# The driver (controller) runs on the head and joins the cluster; Ctrl-C / scancel leave the
# last checkpoint resumable: submit again with the same run_dir to resume.
srun --nodes=1 --ntasks=1 --overlap -w "$head" \
    agentrt train "$CONFIG" --set runtime.address="$head_ip:$PORT"
