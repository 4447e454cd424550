"""fineline's contract, run on this plugin's task and model (one line)."""

from trainables.testing import contract_suite

TestContract = contract_suite(tasks=["parity"], models=["parity_mlp"])
