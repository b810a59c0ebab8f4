"""steerc: a compiler for declarative LLM interventions."""

__version__ = "0.1.0"
