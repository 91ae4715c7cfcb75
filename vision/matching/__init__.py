"""The set loss: `assignment` (``assign``, the scipy solver), `ops_solver` (the ``keras.ops``
solver), `matcher` (``HungarianMatcher``) and `losses` (``SetCriterion``, the proposal losses)."""

__all__: list[str] = []
