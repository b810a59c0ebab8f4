"""The serve target: per-request plans for a vLLM server (steerc.serve/1), and the vLLM-Hook dialect."""
