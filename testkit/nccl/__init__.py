"""Models of NCCL's own code, kept apart from the product's, for tests to hold the two equal."""
