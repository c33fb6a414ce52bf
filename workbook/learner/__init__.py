"""The learner's tools around the labs: hints on request (``hints``), where each lab stands
(``progress``), the self-check again on every save (``watch``). None of them reads ``solutions/``."""
