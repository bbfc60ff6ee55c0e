"""vLLM argument building and the in-pod launcher (stdlib only: it runs inside the vLLM image)."""
