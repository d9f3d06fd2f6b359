"""longroute: a control plane for long-context LLM serving."""

__version__ = "0.1.0"
