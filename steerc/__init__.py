"""steerc: a compiler for declarative LLM interventions."""

__version__ = "0.1.0"

# Where steerc's documentation is published: SARIF logs link each rule to its section of spec/diagnostics.md
# there. steerc has no public address yet, so there is none by default; STEERC_DOCS_URL (a repository URL,
# e.g. https://github.com/ORG/steerc) sets one.
DOCS_URL_VARIABLE = "STEERC_DOCS_URL"


def docs_url() -> str | None:
    """The published home of steerc's source and spec, if ``STEERC_DOCS_URL`` names one."""
    import os

    value = os.environ.get(DOCS_URL_VARIABLE, "").strip().rstrip("/")
    return value if value.startswith(("https://", "http://")) else None
