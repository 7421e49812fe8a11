"""Reference helpers for the PyTorch comparisons: safetensors I/O, llm.c token
shards, loom checkpoints, a plain PyTorch GPT-2 and the training run that
test_train_torch and test_bf16_torch replay."""
