"""A whole LLaMA-family model (placeholder docstring)."""
