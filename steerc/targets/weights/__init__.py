"""The weights target: a program folded into a Hugging Face checkpoint (``layout``: which matrix each site's
kernels fold into, and what is refused; ``fold``: the maths; ``tensors``: safetensors read and written tensor by
tensor; ``emit``: the folder; ``target``: its seat). spec/targets.md, "`weights`"."""
