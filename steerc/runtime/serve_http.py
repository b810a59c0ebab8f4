"""The serve plugin's HTTP front end by its documented path (``--middleware
steerc.runtime.serve_http.SteercAdmission``, spec/targets.md); it is :mod:`steerc.runtime.vllm.http`."""

from steerc.runtime.vllm.http import SteercAdmission

__all__ = ["SteercAdmission"]
