"""``--target easysteer``: an EasySteer ``SteeringSpec`` (``spec.json``) and the GGUF vectors it names."""
