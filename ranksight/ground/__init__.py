"""The ground: ranksight's shared vocabulary, importing nothing of ranksight above it.

- :mod:`~ranksight.ground.env`: every environment variable ranksight reads, by name;
- :mod:`~ranksight.ground.vocab`: finding kinds and causes (``Kind``, ``Cause``);
- :mod:`~ranksight.ground.mesh`: mesh axes (``MeshAxis``) and rank coordinates;
- :mod:`~ranksight.ground.words`: plural and number wording shared by report and UI;
- :mod:`~ranksight.ground.folders`, :mod:`~ranksight.ground.ownership`: where files go and
  who may read them.

Every other layer may import these; these import only the standard library and each other.
"""
