"""Shared fixtures. The Slurm fixture starts a real single-node cluster on localhost (tests/slurm)."""

from slurm_cluster import slurm_cluster  # noqa: F401  (a session fixture used by the Slurm tests)
