"""Teacher side: data, tokenizers, objectives, the training loop and fine-tuning."""
