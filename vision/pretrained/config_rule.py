"""The rule by which a transformers ``config.json`` becomes a detector's arguments (the
rule `nlp.pretrained.hf_config` states for Marian), shared by `vision.pretrained.rtdetr_config`,
`vision.pretrained.dfine_config` and `vision.pretrained.hgnetv2_config`: a field the modeling code
reads is read, or has the one value implemented, or only matters in training (accepted); every other
field is bookkeeping (names, label maps, dtype...), accepted. A field that would change the
computation and is not implemented is refused by name, with the file it is in.
"""

from __future__ import annotations

__all__ = ["ACTIVATIONS", "TRAINING_FIELDS", "activation", "check_fields", "refuse"]

ACTIVATIONS = {"relu": "relu", "silu": "silu", "swish": "silu", "gelu": "gelu",
               "tanh": "tanh", "sigmoid": "sigmoid"}

# Training only (the losses, the matcher, initialization), or no effect on the
# outputs (custom kernels, what is returned; BatchNorm frozen or not: the same in inference;
# anchor_image_size: transformers' anchors for that input size, which equal the ones of the
# actual maps wherever its model runs).
TRAINING_FIELDS = {"auxiliary_loss", "initializer_bias_prior_prob", "initializer_range",
                   "disable_custom_kernels", "output_attentions", "freeze_backbone_batch_norms",
                   "use_pretrained_backbone", "two_stage_num_proposals", "with_box_refine",
                   "anchor_image_size", "feat_strides", "output_hidden_states", "return_dict"}


def refuse(file: str, field: str, value, why: str):
    """Raises the one ValueError of a refused field: ``FILE: FIELD=VALUE WHY``."""
    raise ValueError(f"{file}: {field}={value!r} {why}")


def check_fields(fields: dict, known: set, file: str, read: set, training: set,
                 fixed: dict) -> None:
    """Refuses a field of ``known`` (the modeling code's) that is neither ``read``, nor
    ``training``-only, nor of its one ``fixed`` value (None counts as the default)."""
    for field, value in sorted(fields.items()):
        if field in fixed and value != fixed[field] and not (
                value is None or (field == "backbone_kwargs" and value == {})):
            refuse(file, field, value, f"is not supported (only {fixed[field]!r})")
        if field in known and field not in read | training | set(fixed):
            refuse(file, field, value, "is not implemented by this conversion (refused "
                                       "rather than ignored)")


def activation(file: str, field: str, value: str) -> str:
    """The Keras name of transformers' activation ``value`` (refused if unknown)."""
    if value not in ACTIVATIONS:
        refuse(file, field, value, f"is not supported (one of {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[value]
