#!/bin/bash

# Parameters
#SBATCH --account=speech
#SBATCH --constraint=a100_80g
#SBATCH --cpus-per-task=12
#SBATCH --exclusive
#SBATCH --gpus-per-node=8
#SBATCH --job-name=sweep
#SBATCH --mail-type=FAIL
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output=/SWEEP/.submitit/%j/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --qos=normal
#SBATCH --signal=USR2@120
#SBATCH --time=30
#SBATCH --wckey=submitit

# setup
module load cuda/12.4
source ~/venvs/sweep/bin/activate

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /SWEEP/.submitit/%j/%j_%t_log.out python -u -m submitit.core._submit /SWEEP/.submitit/%j
