"""Views for people and tools: matrices, trees, JSON, explanations, Graphviz."""
