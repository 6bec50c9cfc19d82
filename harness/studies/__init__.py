"""Benchmarks and studies apart from the product: what each fence costs, how fast the harness checks
replays, and the sanitizer's cross-checks against PyTorch's and its cost. The command line runs them
(`fence-harness bench`, `fences`, `checking`, `sanitizer ...`); nothing in the product imports them."""
