"""``--target brainpatch``: a BrainPatch archive (format 1.0), as BrainPatch's ``save_patch`` writes it."""
