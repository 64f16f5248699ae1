"""What the tests (and bench/) share: builders, fixtures and runners. No test module imports another.

tests/ is on sys.path in a pytest run (tests/conftest.py's dir, pytest's rootdir-conftest rule), so a test
imports `from support.results import trial_result`; bench/ scripts put tests/ on sys.path once and import
`support.landscapes` and the rest the same way. Scripts that tests run as programs (fake_train.py,
sweep_server.py, fault_runner.py, ...) stay in tests/ beside the tests that run them.
"""
