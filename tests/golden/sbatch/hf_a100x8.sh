#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=96
#SBATCH --gpus-per-node=8
#SBATCH --job-name=sweep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/SWEEP/.submitit/%j/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --signal=USR2@120
#SBATCH --time=31
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /SWEEP/.submitit/%j/%j_%t_log.out python -u -m submitit.core._submit /SWEEP/.submitit/%j
