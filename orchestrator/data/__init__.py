"""Corpus ingestion, parsing and augmentation (the data path every method reads)."""
