"""The trained translator for other processes: the Translator SavedModel (written by
`nlp.export.translator`, loaded by `nlp.export.load`) and the CTranslate2 model directory."""
