"""Published translation models: transformers' OPUS-MT and NLLB-200 folders, a Hub id, and the
model directory `tfx-convert-nmt` writes."""
