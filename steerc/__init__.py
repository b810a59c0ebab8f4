"""steerc: a compiler for declarative LLM interventions."""

__version__ = "0.1.0"

# Where steerc's documentation lives: SARIF logs link each rule to its section of spec/diagnostics.md here.
HOMEPAGE = "https://github.com/steerc/steerc"
