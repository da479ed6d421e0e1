"""The rank layout of the mesh lives in :mod:`ranksight.mesh` (the ground of the house, so
the hooks can use it without importing the reference trainer); these names are kept for
the code that still imports them from here."""

from ranksight.mesh import MESH_DIM_NAMES, coords_of, rank_of, world_size_of

__all__ = ["MESH_DIM_NAMES", "coords_of", "rank_of", "world_size_of"]
