"""reference_trainer."""
