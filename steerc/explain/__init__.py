"""What a program does, for a person: the plan per layer and site (``plan``), the token table of
``explain --tokens`` (``tokens``) and its HTML page (``html``)."""
