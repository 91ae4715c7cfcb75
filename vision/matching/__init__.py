"""The set loss: `assignment` (exact solvers), `matcher` (``HungarianMatcher``) and `losses`
(``SetCriterion``, the proposal losses)."""

__all__: list[str] = []
