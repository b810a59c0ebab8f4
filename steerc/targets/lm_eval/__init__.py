"""``--target lm-eval``: the CSV steering config of lm-eval-harness's ``steered`` model (spec/formats.md)."""
