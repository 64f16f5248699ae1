"""Hydra Sweeper plugin for `sweep`: hands the multirun over to sweep's asynchronous orchestrator."""
