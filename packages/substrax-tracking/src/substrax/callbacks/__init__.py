"""substrax.callbacks: experiment logging (console, files, tensorboard, w&b, mlflow) and training callbacks (not built yet)."""
