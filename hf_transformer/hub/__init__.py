"""Sharing a model on the Hugging Face Hub: `push.push_folder` uploads an exported folder as one commit, and
`model_card` writes the folder's card (README.md) with its metadata and `model-index` results."""

# The export formats whose folder the Hub shows with a model card, which `push` uploads (`export.FORMATS` names them);
# here, where `hf-transformer export --help` and `push --help` read it without loading the card's dependencies.
CARD_FORMATS = ("hf-transformer", "marian")
