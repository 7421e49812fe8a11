"""Reference helpers for the PyTorch comparisons: safetensors I/O, llm.c token
shards and a plain PyTorch GPT-2."""
