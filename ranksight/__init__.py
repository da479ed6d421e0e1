"""ranksight: find the slow rank, the slow link and the stuck rank in a distributed
PyTorch training job, say why, and say what it costs.

Components live in subpackages: ``trainer_hooks`` (in the training process), ``agent``
(per-node shipper), ``store`` (chdb / ClickHouse), ``analyzer`` (diagnosis),
``reference_trainer`` (a real 3D-parallel GPT with fault injection), ``ui``.
"""

__version__ = "0.1.0"
