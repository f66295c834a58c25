"""Sharing a model on the Hugging Face Hub: `push.push_folder` uploads an exported folder as one commit, and
`model_card` writes the folder's card (README.md) with its metadata and `model-index` results."""
