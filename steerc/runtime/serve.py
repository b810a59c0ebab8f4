"""The serve plugin's documented entry points for vLLM (spec/targets.md), by the paths ``steerc serve``
passes and users name: ``--logits-processors steerc.runtime.serve:SteercGuard``,
``--worker-extension-cls steerc.runtime.serve.SteercServeExtension``, and the ``vllm.general_plugins``
entry point ``steerc.runtime.serve:register``. The plugin itself is :mod:`steerc.runtime.vllm.serve`.
"""

from steerc.runtime.vllm.loader import register
from steerc.runtime.vllm.serve import SteercGuard, SteercServeExtension

__all__ = ["SteercGuard", "SteercServeExtension", "register"]
